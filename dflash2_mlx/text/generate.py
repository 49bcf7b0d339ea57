"""The tokenizer-aware streaming generator: the only layer that touches text.

`stream_generate` wraps either decode loop (speculative when the pair has a
drafter, autoregressive otherwise) and yields one `GenerationResponse` per
generated token. The last response carries `finish_reason` and the stats.
"""

import time
from dataclasses import dataclass, replace
from typing import Callable, Generator, Optional, Sequence, Union

import mlx.core as mx

from ..device import backend_name
from ..engine.adaptive.policy import auto_decides
from ..engine.adaptive.calibrate import Calibration, measure
from ..engine.decode.loop import DecodeCache, autoregressive_generate_step, speculative_generate_step
from ..engine.pair import Pair
from ..engine.decode.profile import CycleProfiler
from ..engine.decode.rows import TokenLogprobs
from ..engine.grammar import Grammar, GrammarState
from ..engine.sampling import SamplingParams
from ..errors import DFlashError
from .context import check_context
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


@dataclass(frozen=True)
class GenerationPlan:
    """What one request decodes with, worked out before anything runs."""

    ids: list  # the prompt's token ids
    history: int  # tokens before this call (the prompt's first token is the cache's last one)
    max_tokens: int  # capped where the context ends
    block: int  # the fixed block, or the most auto may draft
    auto: bool
    policy: object  # the block policy (None: the fixed block)
    rows: dict  # generate_step's grammar (a fresh state), logits_processors, top_logprobs


def plan_generation(pair: Pair, tokenizer, prompt: Union[str, Sequence[int]], *, max_tokens: int = 256,
                    sampling: SamplingParams = SamplingParams(), block_size: Union[int, str, None] = None,
                    calibration: Optional[Calibration] = None, prompt_cache: Optional[DecodeCache] = None,
                    tree_rows: int = 0, grammar: Optional[Grammar] = None, logits_processors: Sequence[Callable] = (),
                    top_logprobs: Optional[int] = None, batched: bool = False) -> GenerationPlan:
    """Check and plan a request (`stream_generate`'s arguments). `batched`: it runs in a
    batch, whose policy keeps the clock (the sequence's own policy runs without one)."""
    if max_tokens < 1:
        raise DFlashError(f"max_tokens {max_tokens} must be at least 1")
    ids = encode_prompt(tokenizer, prompt)
    history = max(len(prompt_cache.tokens) - 1, 0) if prompt_cache is not None else 0
    room = check_context(pair.target, history + len(ids))  # before calibration and prefill
    max_tokens = max_tokens if room is None else min(max_tokens, room)  # a full context ends it ("length")
    state = GrammarState(grammar, tokenizer, pair.target.vocab_size) if grammar is not None else None
    rows = dict(grammar=state, logits_processors=tuple(logits_processors), top_logprobs=top_logprobs)
    auto = auto_decides(pair, block_size, tree_rows)
    B = pair.block_size(None if auto or block_size == "auto" else block_size)
    policy = None
    if auto and max_tokens > 1:
        # Seeded sampling: a schedule that does not depend on the clock, so the
        # same seed gives the same tokens (docs/adaptive.md, "Seeds reproduce").
        clock = None if sampling.seeded or batched else time.perf_counter
        policy = (calibration or measure(pair, ids)).policy(B, clock=clock)
    return GenerationPlan(ids, history, max_tokens, B, auto, policy, rows)


def stream_generate(
    pair: Pair,
    tokenizer,
    prompt: Union[str, Sequence[int]],
    *,
    max_tokens: int = 256,
    sampling: SamplingParams = SamplingParams(),
    block_size: Union[int, str, None] = None,
    calibration: Optional[Calibration] = None,
    stop: Sequence[str] = (),
    prefill_step_size: Optional[int] = None,
    prompt_cache: Optional[DecodeCache] = None,
    profiler: Optional[CycleProfiler] = None,
    tree_rows: int = 0,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
    grammar: Optional[Grammar] = None,
    logits_processors: Sequence[Callable] = (),
    top_logprobs: Optional[int] = None,
) -> Generator[GenerationResponse, None, None]:
    """Stream a completion; DFlash / DFlash 2 when `pair` has a drafter, else plain decoding.

    `block_size` (anchor included) defaults to the drafter's; `pair.block_size`
    says which are valid. `block_size="auto"` picks each cycle's block size
    from `calibration` (measured now, in memory, when not given; see
    `engine.adaptive.calibrate.load_or_calibrate` to keep it on disk), decoding plainly
    where no block size beats plain decoding. The output is the same either way.
    `tree_rows` > 0 verifies trees of that many rows (docs/tree.md); 0 verifies
    the chain. `prompt_progress_callback(done, total)`, as in mlx-lm, is
    called as the prompt's tokens run through the target (0 first, `total`
    last). A prompt that fills the target's context (earlier turns in
    `prompt_cache` included) raises `PromptTooLongError` before any of it
    runs; generation stops, as at `max_tokens`, when the context is full.
    `grammar` (a JSON schema, a regex; engine/grammar.py) constrains the output
    exactly as constrained plain decoding would, inside speculation;
    `logits_processors` (mlx-lm's `make_logits_processors`: logit bias,
    penalties) apply to every verified row with its own prefix; `top_logprobs`
    k fills each response's `logprobs` (the token's and the k most likely).
    """
    plan = plan_generation(pair, tokenizer, prompt, max_tokens=max_tokens, sampling=sampling, block_size=block_size,
                           calibration=calibration, prompt_cache=prompt_cache, tree_rows=tree_rows, grammar=grammar,
                           logits_processors=logits_processors, top_logprobs=top_logprobs)
    profiler = profiler or CycleProfiler()
    common = dict(max_tokens=plan.max_tokens, sampling=sampling, prefill_step_size=prefill_step_size,
                  prompt_cache=prompt_cache, prompt_progress_callback=prompt_progress_callback, **plan.rows)
    if pair.drafter is None:
        steps = autoregressive_generate_step(plan.ids, pair, **common)
    else:
        steps = speculative_generate_step(plan.ids, pair, block_size=plan.block, profiler=profiler,
                                          tree_rows=tree_rows, policy=plan.policy, **common)
    text = TextStream(pair, tokenizer, plan, stop, profiler, tree_rows)
    try:
        for step in steps:
            yield from text.feed(step)
            if text.done:
                return
    finally:
        steps.close()
        if prompt_cache is not None:
            # Tokens verified past an EOS / stop string were never returned.
            prompt_cache.truncate(plan.history + len(plan.ids) + text.n)


class TextStream:
    """A request's decode steps turned into responses: text, EOS, stop strings,
    `max_tokens`, the stats on the last. Fed one `DecodeStep` at a time (by
    `stream_generate`'s loop, or by a batch that runs many requests at once)."""

    def __init__(self, pair: Pair, tokenizer, plan: GenerationPlan, stop: Sequence[str] = (),
                 profiler: Optional[CycleProfiler] = None, tree_rows: int = 0):
        self.pair, self.plan, self.tree_rows = pair, plan, tree_rows
        self.profiler = profiler or CycleProfiler()
        self.eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
        self.detok = IncrementalDetokenizer(tokenizer, plan.ids)
        self.stopper = StopMatcher(stop)
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
        out, kept, ids = [], 0, self.plan.ids
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
                       self.tree_rows)
        return replace(stats, **collective_fields(self.collectives, self.mark))


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
    if policy is not None and policy.report.fallbacks:
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
