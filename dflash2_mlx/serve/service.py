"""The engine service: the model's worker thread, and a FIFO queue for what waits.

With `max_batch` > 1 the worker runs requests together (serve/batching.py,
docs/batching.md); otherwise, or where the pair cannot batch, one at a time.

A single worker thread owns the model and loads it (MLX streams belong to the
thread that made them). Requests wait in a FIFO queue bounded by `max_queue`;
beyond it `submit` raises `QueueFull`. Between tokens the worker checks whether
the client went away, so a cancelled request stops within one decode cycle, and
`stream_generate`'s clean-up rewinds the caches to the tokens it returned.

A request that raises ends alone (a 500 of one line; its caches dropped). A worker
that dies fails every request it holds and all later ones with 503 and says why in
`failure` (/health reports it, cli/serve.py exits on it): the library never exits.
"""

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from ..engine.batch.memory import default_max_batch
from ..engine.batch.passes import batch_blocker
from ..engine.pair import Pair
from ..engine.plan import calibration_for, fit
from ..engine.request import DecodeRequest
from ..errors import DFlashError, PromptTooLongError
from ..text.context import check_context
from ..text.generate import stream_generate
from ..text.prompt import probe_prompt
from ..text.prompt_cache import CacheSettings, PromptCache
from .batching import BatchRunner
from .errors import ApiError, error_line, log_failure
from .jobs import Delta, Failed, Finished, GenerationRequest, Job, Started, Task, fail_all
from .metrics import Metrics

log = logging.getLogger("dflash2.serve")


class QueueFull(Exception):
    """More requests are waiting than the queue allows."""


class ShuttingDown(Exception):
    """The server is draining: it takes no new requests."""


class EngineFailed(Exception):
    """The worker thread died: nothing can run any more (the message says why)."""


class EngineService:
    def __init__(
        self,
        load: Callable[[], tuple[Pair, object]],
        *,
        request: DecodeRequest = DecodeRequest(),
        calibration_folder: Optional[Path] = None,
        recalibrate: bool = False,
        max_queue: int = 32,
        cache_bytes: int = 0,
        cache_dir=None,
        cache_disk_bytes: int = 16 << 30,
        cache_block_tokens: int = 256,
        cache_snapshot_every: Optional[int] = None,
        calibration=None,
        metrics: Optional[Metrics] = None,
        channel=None,
        on_busy: Optional[Callable[[bool], None]] = None,
        max_batch: Optional[int] = None,
    ):
        self._load = load
        self.max_queue = max_queue
        # Requests that share target passes (docs/batching.md); None: from the memory their
        # caches need, once the pair is loaded. `batch_note`: why this pair runs one at a time.
        self.max_batch = max_batch
        self.batch_note: Optional[str] = None
        self._runner: Optional[BatchRunner] = None  # the batch loop, when requests share passes
        self.cache_bytes = cache_bytes
        # The prompt cache (docs/prompt-cache.md): blocks in memory and, with a
        # folder, on disk across restarts; conversation tails in memory.
        self.cache_settings = CacheSettings(memory_bytes=cache_bytes, block_tokens=cache_block_tokens,
                                            folder=cache_dir, disk_bytes=cache_disk_bytes)
        if cache_snapshot_every is not None:
            self.cache_settings = replace(self.cache_settings, snapshot_every=cache_snapshot_every)
        # The server's settings every request starts from (block size, tree, prefill step);
        # a request's body sets the rest (`GenerationRequest.decode_request`).
        self.request = request
        # For block_size "auto": given, or read from `calibration_folder` (measured there once,
        # `recalibrate`: again) when the pair is loaded; None: measured per request, in memory.
        self.calibration = calibration
        self.calibration_folder, self.recalibrate = calibration_folder, recalibrate
        self.metrics = metrics or Metrics()
        # With the target split over ranks (serve/ranks.py): rank 0 sends each
        # request through `channel` before running it; `on_busy(True/False)`
        # arms and disarms the rank's watchdog around each generation.
        self.channel = channel
        self.on_busy = on_busy
        self.on_fatal: Optional[Callable[[str], None]] = None  # with ranks: ends this rank
        self.pair: Optional[Pair] = None
        self.tokenizer = None
        self.pool: Optional[PromptCache] = None
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._lock = threading.Lock()
        self._outstanding = 0  # submitted and not yet finished: the running one and the queue
        self._busy = False
        self._stopping = False
        self._ready = threading.Event()
        self._load_error: Optional[BaseException] = None
        # Why the worker died, in one line (None while it serves); `on_failed(line)` is
        # called on the dying worker's thread, once.
        self.failure: Optional[str] = None
        self.on_failed: Optional[Callable[[str], None]] = None
        self._current = None  # the job or task running alone, for a worker that dies under it
        self._thread = threading.Thread(target=self._main, name="dflash2-engine", daemon=True)

    # -- life cycle (caller's thread) ---------------------------------------------------
    def start(self) -> tuple[Pair, object]:
        """Start the worker and wait until `load()` has returned (pair, tokenizer)
        on it, re-raising the loader's error (e.g. a `DFlashError` naming a bad path)."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            self._thread.join()
            raise self._load_error
        return self.pair, self.tokenizer

    def stop(self) -> None:
        """Finish the running and queued requests, then end the worker."""
        with self._lock:
            self._stopping = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # -- requests (event-loop thread) -------------------------------------------------
    def submit(self, request: GenerationRequest) -> Job:
        """Queue `request`; a prompt that fills the model's context is a 400 here, before a
        streamed answer starts (an answer that reaches the context's end stops: "length")."""
        try:
            check_context(getattr(self.pair, "target", None), len(request.prompt_ids))
        except PromptTooLongError as e:
            raise ApiError(400, str(e)) from None
        return self._enqueue(Job(request, asyncio.get_running_loop()))

    def submit_task(self, work: Callable[["EngineService"], object]) -> "Task":
        """Queue `work(service)` to run on the worker, between generations and never
        beside one (the race: serve/web.py). Refused like a request when the queue
        is full or the server stops; `await task.result()` gives what it returned."""
        if self.channel is not None:  # the other ranks run only generations
            raise ApiError(400, "this server splits the target over ranks: the race runs on a single-process server")
        return self._enqueue(Task(work, asyncio.get_running_loop()))

    def _enqueue(self, job):
        # Put under the lock: a worker that dies takes the lock to fail what is queued,
        # so no job slips into the queue after that.
        with self._lock:
            if self.failure is not None:
                raise EngineFailed(self.failure)
            if self._stopping:
                raise ShuttingDown()
            if self._outstanding >= self.max_queue + self.running_limit:  # running, and max_queue waiting
                raise QueueFull()
            self._outstanding += 1
            self._queue.put(job)
        return job

    @property
    def running_limit(self) -> int:
        """Requests that may run at once."""
        return max(self.max_batch or 1, 1) if self.batch_note is None else 1

    @property
    def active(self) -> int:
        """Requests running now: the batch's, or the one generation (or task) running alone."""
        return len(self._runner.running) if self._runner is not None else int(self._busy)

    @property
    def queue_length(self) -> int:
        """Requests waiting for the model (the running ones not counted)."""
        # A task runs alone, outside the batch: busy then, with no request running.
        return max(0, self._outstanding - max(self.active, int(self._busy)))

    @property
    def busy(self) -> bool:
        return self._busy or self.active > 0

    # -- what the batch runner asks of the service (worker thread) ---------------------
    def next_job(self, block: bool):
        """The next queued job (None: the stop job); raises queue.Empty when none waits and not `block`."""
        return self._queue.get(block=block)

    def job_done(self) -> None:
        with self._lock:
            self._outstanding -= 1

    def run_task(self, task: "Task") -> None:
        self._busy, self._current = True, task
        try:
            task.run(self)
            self._current = None
        finally:
            self._busy = False
            self.job_done()

    # -- the worker thread ------------------------------------------------------------
    def _main(self) -> None:
        try:
            try:
                self.pair, self.tokenizer = self._load()
                fit(self.pair, self.request)  # a block or tree the drafter cannot draft: at start, not per request
                self._calibrate()
                self.pool = PromptCache(self.pair, self.cache_settings, warn=log.warning)
                runner = self._batch_runner()
            except BaseException as e:  # handed to start(), which re-raises it
                self._load_error = e
                return
            finally:
                self._ready.set()
            try:
                if runner is not None:
                    self._runner = runner
                    runner.run()
                else:
                    self._serve_one_at_a_time()
            except BaseException as e:  # the worker cannot go on
                self._die(e)
        finally:
            if self.pool is not None:
                self.pool.close()  # at stop (SIGTERM too): the blocks still queued reach the disk
            # MLX keeps per-thread streams; without this the process aborts at
            # exit ("terminate called without an active exception").
            mx.synchronize()
            mx.clear_streams()

    def _serve_one_at_a_time(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                if self.channel is not None:
                    self.channel.send(None)  # the followers return
                return
            self._busy, self._current = True, job
            try:
                job.run(self) if isinstance(job, Task) else self._run(job)
                self._current = None  # left set when a BaseException ends the worker here
            finally:
                self._busy = False
                with self._lock:
                    self._outstanding -= 1

    def _die(self, e: BaseException) -> None:
        """The worker's end: `failure` set, a 503 for all it held, ran or queued, then `on_failed`."""
        line = error_line(e)
        log.debug("the engine stopped", exc_info=e)
        with self._lock, self._queue.mutex:  # _enqueue puts under self._lock: nothing joins after this
            self.failure, waiting = line, list(self._queue.queue)
            self._queue.queue.clear()
        runner = self._runner
        held = [r.job for r in runner.running] + list(runner.tasks) if runner is not None else []
        fail_all(held + [self._current] + waiting, line, EngineFailed(line))
        if self.on_failed is not None:
            self.on_failed(line)

    def _calibrate(self) -> None:
        """Read (or measure once) the costs block_size "auto" needs, as the command line does;
        ranks of a split target decode the drafter's fixed block."""
        if self.calibration is None:
            settled = calibration_for(self.pair, self.request, self.calibration_folder, probe_prompt(self.tokenizer),
                                      recalibrate=self.recalibrate, ranks=self.channel is not None,
                                      measuring=_measuring_note)
            self.request, self.calibration = settled.request, settled.calibration
            if settled.note is not None:
                log.warning(settled.note)

    def _batch_runner(self):
        """The batch runner when requests can share passes here, else None (one at a
        time; `batch_note` says why when more than one was asked for)."""
        if self.max_batch is None:
            self.max_batch = default_max_batch(self.pair)
        why = "the target is split over ranks" if self.channel is not None else batch_blocker(self.pair)
        if self.max_batch <= 1:
            return None
        if why is not None:
            self.batch_note = f"one request at a time: {why}"
            log.warning(f"--max-batch {self.max_batch}: {self.batch_note}")
            return None
        policy = None
        if self.request.auto and self.calibration is not None and hasattr(self.calibration, "batch_policy"):
            policy = self.calibration.batch_policy(clock=time.perf_counter)
        return BatchRunner(self, self.max_batch, policy)

    def _run(self, job: Job) -> None:
        """One request, alone; whatever it raises ends it (a 500) and nothing else."""
        try:
            self._generate_job(job)
        except Exception as e:
            job.post(Failed(self._internal("generation failed", e)))

    def _internal(self, what: str, e: Exception) -> str:
        """A bug's one line, logged; with ranks (a lost peer, likely) `on_fatal` ends the rank."""
        if self.channel is not None and self.on_fatal is not None:
            self.on_fatal(error_line(e))
        return log_failure(log, what, e)

    def _generate_job(self, job: Job) -> None:
        request = job.request
        if job.cancelled.is_set():  # the client left while the request waited
            self.metrics.cancelled += 1
            return
        channel = self.channel
        if channel is not None:
            request = channel.send(request)

        def go() -> bool:
            keep = not job.cancelled.is_set()
            return keep if channel is None else channel.agree(keep)

        outcome = self.generate(request, go, lambda n, cached: job.post(Started(n, cached)),
                                lambda r: job.post(Delta(r.text, r.token, r.logprobs, r.from_draft)))
        if isinstance(outcome, Failed):
            job.post(outcome)
            return
        ids, reuse, n, last, cancelled = outcome
        self.report(job, ids, reuse, n, last, cancelled)  # new blocks reach the disk on the writer's thread

    def report(self, job: Job, ids: list, reuse, n: int, last, cancelled: bool, batch: int = 1) -> None:
        """The end of an answer: into the metrics, and `Finished` to its client
        (`last`: its final response; `batch`: the most requests it shared a pass with)."""
        eos = last is not None and last.token in set(getattr(self.tokenizer, "eos_token_ids", None) or [])
        stats = None if cancelled or last is None else last.stats
        finish = "cancelled" if cancelled else (last.finish_reason or "length")
        self.metrics.record(len(ids), reuse.tokens, n, stats, cancelled, cached_disk=reuse.disk)
        job.post(Finished(finish, len(ids), n, reuse.tokens, eos, stats, cached_disk=reuse.disk, batch=batch,
                          max_batch=self.running_limit, batch_note=self.batch_note))

    def follow(self) -> None:
        """A follower rank: run every request rank 0 sends, as it does, until
        the stop job (on the calling thread; `load` runs here too)."""
        self.pair, self.tokenizer = self._load()
        fit(self.pair, self.request)
        self._calibrate()  # as rank 0 does: every rank decodes the same settled request
        self.pool = PromptCache(self.pair, self.cache_settings, warn=log.warning)
        while (request := self.channel.receive()) is not None:
            self.generate(request, lambda: self.channel.agree(True), lambda n, cached: None, lambda r: None)
        self.pool.close()
        mx.synchronize()

    def generate(self, request: GenerationRequest, go: Callable[[], bool], started, delta):
        """Run one request with the prompt cache; `go()` is asked before each
        token is taken. Returns (ids, reuse, n, last, cancelled) or `Failed`."""
        ids = list(request.prompt_ids)
        try:
            decode = request.decode_request(self.request)
        except DFlashError as e:
            return Failed(str(e), 400)
        # The prompt's cached blocks, then its other whole blocks run and kept;
        # `prompt` is the rest, starting with the cache's last token.
        if self.on_busy is not None:  # armed before the blocks' prefill (with ranks it runs collectives)
            self.on_busy(True)
        try:
            cache, prompt, reuse = self.pool.prepare(ids, self.request.prefill_step_size)
        except Exception as e:  # the caches it took are dropped
            if self.on_busy is not None:
                self.on_busy(False)
            return Failed(str(e), 400) if isinstance(e, DFlashError) else Failed(self._internal("prefill failed", e))
        started(len(ids), reuse.tokens)
        responses = stream_generate(self.pair, self.tokenizer, prompt, decode, calibration=self.calibration,
                                    prompt_cache=cache)
        n, last, cancelled = 0, None, False
        try:
            for r in responses:
                if not go():
                    cancelled = True
                    break
                n, last = n + 1, r
                delta(r)
        except DFlashError as e:
            return Failed(str(e), 400)
        except Exception as e:  # a bug: logged here, one line to the client; the caches are dropped
            return Failed(self._internal("generation failed", e))
        finally:
            responses.close()  # rewinds the caches to the tokens returned
            if self.on_busy is not None:
                self.on_busy(False)
        if cache.at_rest:
            self.pool.put(cache)
        return ids, reuse, n, last, cancelled


def _measuring_note():
    log.warning("measuring this machine's decode costs for --block-size auto (once per machine and pair)")
    return contextlib.nullcontext()
