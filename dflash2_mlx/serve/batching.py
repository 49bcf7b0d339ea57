"""The worker's loop when requests share target passes (continuous batching).

Up to `max_batch` requests run at once in one `BatchDecoder`: every step it
runs one 256-token block of the oldest joining request's uncached prompt
(kept in the prompt cache as it goes) or one prefill chunk, then one cycle of
every running request. A request leaves between steps when it finishes, hits a
stop string or EOS, or its client goes away; the next queued one joins. Work
that must run alone (the race) waits until the batch is empty. Each request's
text is `TextStream`'s, exactly as `stream_generate` makes it alone.

A request that raises leaves alone with a 500 of one line (its caches are
dropped): in its prompt's blocks, its plan, its prefill and first token
(`SequenceFailed`), its text. A failure inside the shared cycle cannot be
pinned on one request (every running one's caches took the pass): it ends
those requests, and the loop goes on with a fresh decoder.
"""

import logging
import queue
from dataclasses import dataclass, field
from typing import Optional

import mlx.core as mx

from ..engine.batch.decoder import BatchDecoder, BatchSequence, SequenceFailed
from ..engine.plan import plan
from ..engine.residency import generation_stream, wired_limit
from ..engine.decode.state import DecodeCache
from ..errors import DFlashError
from ..text.generate import GenerationResponse, TextStream
from ..text.prompt_cache import still_to_run
from .errors import log_failure
from .jobs import Delta, Failed, Job, Started

log = logging.getLogger("dflash2.serve")


@dataclass
class _Running:
    job: Job
    ids: list
    cache: DecodeCache
    reuse: object
    stream: Optional[TextStream] = None
    plan: object = None
    context: int = 0  # the tokens the caches hold once its prompt has run (history and prompt)
    warming: bool = True  # the prompt's uncached whole blocks are still running
    n: int = 0
    last: Optional[GenerationResponse] = None
    seq: Optional[BatchSequence] = field(default=None, repr=False)


class BatchRunner:
    """Runs the service's jobs in batches; `run()` returns at the stop job."""

    def __init__(self, service, max_batch: int, policy=None):
        self.service, self.max_batch = service, max_batch
        self.decoder = BatchDecoder(service.pair, max_batch, policy)
        self.running: list[_Running] = []
        self.tasks: list = []  # work that runs alone, once the batch is empty
        self.stopping = False

    def run(self) -> None:
        # As stream_generate (and mlx-lm): the engine's work on the generation stream, the
        # pair's weights kept resident while the batch serves.
        with wired_limit(self.service.pair, [generation_stream]), mx.stream(generation_stream):
            while True:
                if not self.running:
                    for task in self.tasks:
                        self.service.run_task(task)
                    self.tasks.clear()
                    if self.stopping:
                        return
                self._take_jobs()
                if self.running:
                    self._step()

    # -- the queue ----------------------------------------------------------------------
    def _take_jobs(self) -> None:
        """Admit queued requests while there is room; wait for one when idle."""
        service = self.service
        while not self.stopping and len(self.running) < self.max_batch:
            idle = not self.running and not self.tasks
            try:
                job = service.next_job(block=idle)
            except queue.Empty:
                return
            if job is None:
                self.stopping = True
            elif not isinstance(job, Job):
                self.tasks.append(job)
                if not self.running:
                    return
            else:
                self._admit(job)

    def _admit(self, job: Job) -> None:
        service = self.service
        if job.cancelled.is_set():  # the client left while the request waited
            service.metrics.cancelled += 1
            service.job_done()
            return
        ids = list(job.request.prompt_ids)
        try:
            cache, reuse = service.pool.take(ids)
        except Exception as e:
            job.post(Failed(log_failure(log, "admitting a request failed", e)))
            service.job_done()
            return
        job.post(Started(len(ids), reuse.tokens))
        self.running.append(_Running(job, ids, cache, reuse))

    # -- one step -------------------------------------------------------------------------
    def _step(self) -> None:
        warming = next((r for r in self.running if r.warming), None)
        if warming is not None:
            self._warm(warming)  # one block of its prompt, or it joins the decoder; the others' cycle follows
        passes = self.decoder.passes
        try:
            steps = self.decoder.step()
        except SequenceFailed as e:  # one request's own step: the others run on next step
            failed = next(r for r in self.running if r.seq is e.seq)
            self._fail(failed, Failed(log_failure(log, "generation failed", e.error)))
            return
        except Exception as e:  # a bug in the shared cycle: its requests end with one line, the others wait
            failed = Failed(log_failure(log, "batched generation failed", e))
            for r in [r for r in self.running if r.seq is not None]:
                self._fail(r, failed, leave_decoder=False)
            self.decoder = BatchDecoder(self.service.pair, self.max_batch, self.decoder.policy)
            return
        by_seq = {id(r.seq): r for r in self.running if r.seq is not None}
        for seq, step in steps:
            r = by_seq[id(seq)]
            try:
                for response in r.stream.feed(step):
                    r.n, r.last = r.n + 1, response
                    r.job.post(Delta(response.text, response.token, response.logprobs, response.from_draft))
                if r.stream.done or seq.finished:
                    self._finish(r, cancelled=False)
            except Exception as e:
                self._fail(r, Failed(log_failure(log, "batched generation failed", e)))
        if self.decoder.passes > passes:
            committed = sum(len(step.tokens) for _, step in steps if step.verify_rows)
            self.service.metrics.record_pass(*self.decoder.last_pass, committed)
        for r in list(self.running):
            if r.job.cancelled.is_set():
                self._finish(r, cancelled=True)

    def _warm(self, r: _Running) -> None:
        """One whole block of `r`'s uncached prompt, or, when none is left, `r` joins the decoder."""
        service = self.service
        try:
            if service.pool.extend(r.cache, r.ids, service.request.prefill_step_size, max_blocks=1):
                return
            decode = r.job.request.decode_request(service.request)
            prompt = still_to_run(r.cache, r.ids)
            history = max(len(r.cache.tokens) - 1, 0)
            r.plan = plan(service.pair, decode, service.calibration, prompt_ids=prompt, history=history,
                          tokenizer=service.tokenizer, batched=True)
            r.context = history + len(prompt)
            r.seq = self.decoder.add(prompt, r.plan, prompt_cache=r.cache)
            r.stream = TextStream(service.pair, service.tokenizer, prompt, r.plan, r.seq.profiler)
        except DFlashError as e:
            self._fail(r, Failed(str(e), 400))
            return
        except Exception as e:
            self._fail(r, Failed(log_failure(log, "preparing a request failed", e)))
            return
        r.warming = False

    # -- leaving -------------------------------------------------------------------------
    def _finish(self, r: _Running, cancelled: bool) -> None:
        service = self.service
        self.running.remove(r)
        try:
            if r.seq is not None:  # None: cancelled while its prompt's blocks still ran
                self.decoder.remove(r.seq)
                r.cache.truncate(r.context + r.n)  # tokens past a stop were never returned
            if r.cache.at_rest:
                service.pool.put(r.cache)
            batch = r.seq.largest_batch if r.seq is not None else 1
            service.report(r.job, r.ids, r.reuse, r.n, r.last, cancelled, batch=batch)
        except Exception as e:  # after Finished it changes nothing: the reader stopped there
            r.job.post(Failed(log_failure(log, "finishing a request failed", e)))
        finally:
            service.job_done()

    def _fail(self, r: _Running, failed: Failed, leave_decoder: bool = True) -> None:
        """`r` ends with `failed`; its caches are dropped (they may hold half a step)."""
        if r in self.running:
            self.running.remove(r)
        try:
            if leave_decoder and r.seq is not None:
                self.decoder.remove(r.seq)
        finally:
            r.job.post(failed)
            self.service.job_done()
