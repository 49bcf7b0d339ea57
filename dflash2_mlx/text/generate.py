"""The tokenizer-aware streaming generator: the only layer that touches text.

`stream_generate` plans a `DecodeRequest` and wraps the decode loop
(speculative when the pair has a drafter, autoregressive otherwise) and yields one `GenerationResponse` per
generated token. The last response carries `finish_reason` and the stats.
"""

import time
from dataclasses import dataclass, replace
from typing import Callable, Generator, Optional, Sequence, Union

import mlx.core as mx

from ..device import backend_name
from ..engine.adaptive.calibrate import Calibration
from ..engine.decode.loop import DecodeCache, generate_step
from ..engine.decode.profile import CycleProfiler
from ..engine.decode.rows import TokenLogprobs
from ..engine.pair import Pair
from ..engine.plan import DecodePlan, plan
from ..engine.request import DecodeRequest
from ..engine.residency import generation_stream, wired_limit
from .detokenize import IncrementalDetokenizer, StopMatcher
from .stats import GenerationStats, StatsRecorder, collective_fields


@dataclass(frozen=True)
class GenerationResponse:
    text: str  # the new text this token completes ('' while a character is incomplete)
    token: int
    from_draft: bool  # drafted by the drafter and accepted by the target
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float  # GB
    finish_reason: Optional[str] = None  # "stop" (EOS or stop string) or "length"
    stats: Optional[GenerationStats] = None  # on the final response only
    logprobs: Optional[TokenLogprobs] = None  # when `top_logprobs` was asked for


def encode_prompt(tokenizer, prompt: Union[str, Sequence[int]]) -> list[int]:
    """Token ids for `prompt` (text is encoded, ids pass through)."""
    if isinstance(prompt, str):
        bos = getattr(tokenizer, "bos_token", None)
        return tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
    return [int(t) for t in prompt]


def stream_generate(
    pair: Pair,
    tokenizer,
    prompt: Union[str, Sequence[int]],
    request: DecodeRequest = DecodeRequest(),
    *,
    calibration: Optional[Calibration] = None,
    prompt_cache: Optional[DecodeCache] = None,
    profiler: Optional[CycleProfiler] = None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
) -> Generator[GenerationResponse, None, None]:
    """Stream a completion of `prompt` as `request` (engine/request.py) asks;
    DFlash / DFlash 2 when `pair` has a drafter, else plain decoding.

    `block_size="auto"` (the default, as on the command line) picks each cycle's
    block size from `calibration` (measured now, in memory, when not given:
    `engine.plan.calibration_for` keeps it on disk), decoding plainly where no
    block size beats plain decoding. The output is the same either way.
    `prompt_progress_callback(done, total)`, as in mlx-lm, is called as the
    prompt's tokens run through the target (0 first, `total` last). A prompt
    that fills the target's context (earlier turns in `prompt_cache` included)
    raises `PromptTooLongError` before any of it runs; generation stops, as at
    `max_tokens`, when the context is full.
    """
    ids = encode_prompt(tokenizer, prompt)
    history = max(len(prompt_cache.tokens) - 1, 0) if prompt_cache is not None else 0
    decode = plan(pair, request, calibration, prompt_ids=ids, history=history, tokenizer=tokenizer)
    profiler = profiler or CycleProfiler()
    text = TextStream(pair, tokenizer, ids, decode, profiler)
    with wired_limit(pair, [generation_stream]):
        steps = generate_step(ids, pair, decode, prompt_cache=prompt_cache, profiler=profiler,
                              prompt_progress_callback=prompt_progress_callback)
        try:
            while True:
                with mx.stream(generation_stream):  # the engine's work on its own stream, as mlx-lm's
                    step = next(steps, None)
                if step is None:
                    return
                yield from text.feed(step)
                if text.done:
                    return
        finally:
            steps.close()
            if prompt_cache is not None:
                # Tokens verified past an EOS / stop string were never returned.
                prompt_cache.truncate(history + len(ids) + text.n)


class TextStream:
    """A request's decode steps turned into responses: text, EOS, stop strings,
    `max_tokens`, the stats on the last. Fed one `DecodeStep` at a time (by
    `stream_generate`'s loop, or by a batch that runs many requests at once)."""

    def __init__(self, pair: Pair, tokenizer, ids: Sequence[int], plan: DecodePlan,
                 profiler: Optional[CycleProfiler] = None):
        self.pair, self.ids, self.plan = pair, ids, plan
        self.profiler = profiler or CycleProfiler()
        self.eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
        self.detok = IncrementalDetokenizer(tokenizer, ids)
        self.stopper = StopMatcher(plan.request.stop)
        self.recorder = StatsRecorder(plan.block)
        self.collectives, self.mark = getattr(pair.target, "collectives", None), None  # a target split over ranks
        self.steps = self.n = 0
        self.done = False
        self.prompt_time = self.decode_start = 0.0
        mx.reset_peak_memory()
        self.tic = time.perf_counter()

    def feed(self, step) -> list[GenerationResponse]:
        """The responses for one step's tokens; the last carries the finish reason when it ends the answer."""
        index, self.steps = self.steps, self.steps + 1
        if index == 0:  # the prefill pass produced the first token
            self.decode_start = time.perf_counter()
            self.prompt_time = self.decode_start - self.tic
            self.mark = self.collectives.mark() if self.collectives is not None else None
        out, kept, ids = [], 0, self.ids
        for i, (token, drafted) in enumerate(zip(step.tokens, step.from_draft)):
            self.n += 1
            kept += 1
            text, finish = _next_text(token, self.n, self.plan.max_tokens, self.eos, self.detok, self.stopper)
            elapsed = time.perf_counter() - self.decode_start
            response = GenerationResponse(
                text=text, token=token, from_draft=drafted, prompt_tokens=len(ids),
                prompt_tps=len(ids) / self.prompt_time if self.prompt_time else 0.0,
                generation_tokens=self.n,
                generation_tps=(self.n - 1) / elapsed if self.n > 1 and elapsed > 0 else 0.0,
                peak_memory=mx.get_peak_memory() / 1e9,
                logprobs=step.logprobs[i] if step.logprobs else None,
            )
            if finish:
                if index > 0:
                    self.recorder.add(step, kept)
                self.done = True
                out.append(replace(response, finish_reason=finish, stats=self._stats(response)))
                return out
            out.append(response)
        if index > 0:
            self.recorder.add(step, kept)
        return out

    def _stats(self, response: GenerationResponse) -> GenerationStats:
        plan = self.plan
        stats = _stats(self.recorder, response, self.pair.kind, plan.block, self.profiler, plan.policy, plan.auto,
                       plan.tree_rows)
        return replace(stats, **collective_fields(self.collectives, self.mark, self.pair.target.activation_dtype))


def _next_text(token, n, max_tokens, eos, detok, stopper) -> tuple[str, Optional[str]]:
    """Text for this token and the finish reason it causes, if any."""
    if token in eos:
        return stopper.flush() + detok.flush(), "stop"
    text, stopped = stopper.feed(detok.add(token))
    if stopped:
        return text, "stop"
    if n == max_tokens:
        tail, stopped = stopper.feed(detok.flush())
        return text + tail + ("" if stopped else stopper.flush()), "stop" if stopped else "length"
    return text, None


def _stats(recorder: StatsRecorder, r: GenerationResponse, mode: str, B: int,
           profiler: CycleProfiler, policy=None, auto: bool = False,
           tree_rows: int = 0) -> GenerationStats:
    spec = mode != "ar"
    fallback = None
    if getattr(policy, "report", None) is not None and policy.report.fallbacks:
        # Token indices count from the first generated token (the prefill's).
        fallback = "; ".join(("from the start" if at == 0 else f"after {at + 1} tokens") + f": {why}"
                             for at, why in policy.report.fallbacks[:3])
    return GenerationStats(
        prompt_tokens=r.prompt_tokens,
        generation_tokens=r.generation_tokens,
        prompt_tps=r.prompt_tps,
        generation_tps=r.generation_tps,
        target_passes=recorder.passes,
        mean_acceptance_length=recorder.mean_acceptance_length,
        acceptance_by_position=recorder.by_position,
        acceptance_histogram=recorder.histogram,
        drafted=recorder.drafted,
        accepted=recorder.accepted,
        peak_memory_gb=r.peak_memory,
        backend=backend_name(),
        mode=mode,
        block_size=B,
        host_syncs_per_pass=(profiler.fetches / recorder.passes) if mode != "ar" and recorder.passes else None,
        tree_rows=tree_rows if mode != "ar" else 0,
        verify_rows=recorder.verify_rows,
        tau_per_verify_row=recorder.tau_per_verify_row,
        block_policy="auto" if auto else "fixed",
        block_sizes=dict(sorted(recorder.block_sizes.items())) if spec else None,
        plain_share=recorder.plain_share if spec else None,
        fallback=fallback,
    )
