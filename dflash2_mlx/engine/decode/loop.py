"""The decode loop. It knows nothing about text: token ids in, token ids out.

Chunked prefill, then cycles: the policy chooses each cycle's block size
(1 = a plain step), the cycle runs (a chain, a tree or a plain step) and
returns a `CycleOutcome`, and one tail commits it and yields a `DecodeStep`
(docs/algorithm.md §5). Without a drafter every cycle is a plain step, which
is `--ar`. The loop leaves its caches consistent when closed early.
"""

from typing import Callable, Generator, Optional, Sequence

import mlx.core as mx

from ...device import default_prefill_step_size
from ...errors import DFlashError
from ..grammar import GrammarState
from ..pair import Pair
from ..sampling import SamplingParams, make_key, make_logprobs_transform, split_key, token_sampler
from ..tree.cycle import tree_cycle, tree_rows_for
from .chain import chain_cycle
from .plain import PlainStep
from .profile import CycleProfiler
from .rows import RowRule
from .state import FLUSH_ROWS, Choice, CycleOutcome, DecodeCache, DecodeStep, FixedBlock, PendingFeatures

__all__ = ["DecodeCache", "DecodeStep", "generate_step", "speculative_generate_step",
           "autoregressive_generate_step"]


def generate_step(
    prompt,
    pair: Pair,
    *,
    max_tokens: int = 256,
    block_size: Optional[int] = None,
    sampling: SamplingParams = SamplingParams(),
    prefill_step_size: Optional[int] = None,
    prompt_cache: Optional[DecodeCache] = None,
    profiler: Optional[CycleProfiler] = None,
    tree_rows: int = 0,
    policy=None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
    grammar: Optional[GrammarState] = None,
    logits_processors: Sequence[Callable] = (),
    top_logprobs: Optional[int] = None,
) -> Generator[DecodeStep, None, None]:
    """Lossless decoding of `pair`; yields one step per target pass.

    `block_size` (default: the checkpoint's) counts the anchor. `policy`
    (`choose(tokens_left, context)` -> a `Choice`, `record`, `observe(drafted, accepted)`,
    e.g. an `adaptive.BlockPolicy`) picks every cycle's block size instead.
    `tree_rows` > 0 verifies trees from the drafter's lattice (docs/tree.md).
    `prompt_cache` holds earlier context; `prompt` then starts with its last
    committed token. `prompt_progress_callback(done, total)`: mlx-lm's.
    `grammar` (a fresh `GrammarState`, docs/structured.md), `logits_processors`
    (mlx-lm's bias and penalties) and `top_logprobs` k: rows.py.
    """
    drafter, block, prompt = pair.drafter, pair.block_size(block_size), check_prompt(prompt)
    cache = cache_for(prompt, pair, prompt_cache)
    profiler = profiler or CycleProfiler()
    transform = make_logprobs_transform(sampling)
    tree_rows = tree_rows_for(pair, tree_rows) if drafter is not None else 0
    sample, rule = token_sampler(sampling, transform), row_rule(grammar, logits_processors, top_logprobs)
    if policy is None or tree_rows:  # the cost model is the chain's: a tree drafts the fixed block
        policy = FixedBlock(block)
    key, sub = split_key(make_key(sampling))
    last = prefill(prompt, pair, cache, prefill_step_size, prompt_progress_callback)
    cache.record_prompt(prompt)
    plain = PlainStep.sampled(last, cache, sample, sub, rule, rows=0)
    pending, left, choice, anchor = PendingFeatures.taking_over(cache), max_tokens, None, None
    try:
        while True:
            if plain is not None:
                # Decide what follows before fetching this token, so a plain
                # next step can be launched first.
                choice = decide(policy, left - 1, len(cache.tokens))
                ahead = None
                if choice is not None and choice.block == 1 and not (rule is not None and rule.needs_tokens):
                    key, sub = split_key(key)
                    ahead = PlainStep.launch(pair, cache, plain.token, sample, sub, rule)
                outcome, plain = plain.finish(profiler), ahead
            else:
                key, k_draft, k_accept = split_key(key, 3)
                cycle = dict(block=choice.block, sampling=sampling, transform=transform, left=left, profiler=profiler)
                if tree_rows:
                    outcome = tree_cycle(pair, cache, anchor, pending.take(), rows=tree_rows, key=k_accept, rule=rule,
                                         **cycle)
                else:
                    outcome = chain_cycle(pair, cache, anchor, pending.take(), (k_draft, k_accept), rule, **cycle)
                choice = None
            left = commit_outcome(outcome, cache, pending, policy, drafter, left, grammar)
            yield outcome.step()
            anchor = outcome.tokens[-1]
            if grammar is not None and grammar.done:  # complete: nothing may follow
                choice = None
            elif plain is None and choice is None:
                choice = decide(policy, left, len(cache.tokens))
            if plain is None and choice is not None and choice.block == 1:
                key, sub = split_key(key)
                plain = PlainStep.launch(pair, cache, mx.array([anchor], dtype=mx.int32), sample, sub, rule)
            if plain is None and choice is None:
                return
    finally:
        if plain is not None:  # closed early: undo the look-ahead row
            plain.cancel(pair, cache)
        # The target cache holds every committed token but the last; the rows the
        # drafter has not read wait in the cache (a later call catches it up first).
        if drafter is not None:
            pending.leave_unread(cache)


def row_rule(grammar, processors, top_logprobs) -> Optional[RowRule]:
    """The rows' rule (rows.py), None when the raw target rows are decoded as they are."""
    if grammar is None and not processors and top_logprobs is None:
        return None
    return RowRule(processors, grammar, top_logprobs)


def decide(policy, tokens_left: int, context: int) -> Optional[Choice]:
    """The policy's choice for the next cycle, acted on; None when no tokens are left.
    `context`: the tokens committed so far (a cycle reads them all: its cost grows with them)."""
    if tokens_left <= 0:
        return None
    choice = policy.choose(tokens_left, context)
    policy.record(choice)
    return choice


def commit_outcome(outcome: CycleOutcome, cache: DecodeCache, pending: PendingFeatures, policy, drafter,
            left: int, grammar: Optional[GrammarState]) -> int:
    """The one commit tail: tokens and undo record into the cache (and the
    grammar), features towards the drafter, the outcome to the policy.
    Returns the tokens left."""
    cache.commit(outcome.tokens, outcome.undo)
    if grammar is not None:
        grammar.advance(outcome.tokens)
    pending.add(outcome.features)
    if drafter is not None and pending.rows >= FLUSH_ROWS:
        pending.flush(drafter, cache)
    if outcome.drafted:
        policy.observe(outcome.drafted, outcome.accepted)
    return left - len(outcome.tokens)


def speculative_generate_step(prompt, pair: Pair, **kwargs) -> Generator[DecodeStep, None, None]:
    """`generate_step` for a pair with a drafter (block speculative decoding)."""
    if pair.drafter is None:
        raise DFlashError("speculative decoding needs a pair with a drafter")
    return generate_step(prompt, pair, **kwargs)


def autoregressive_generate_step(
    prompt,
    pair: Pair,
    *,
    max_tokens: int = 256,
    sampling: SamplingParams = SamplingParams(),
    prefill_step_size: Optional[int] = None,
    prompt_cache: Optional[DecodeCache] = None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
    **rows,
) -> Generator[DecodeStep, None, None]:
    """Plain decoding through the same loop and sampling code, for baselines
    (`--ar`); a drafter in `pair` is ignored. `rows`: generate_step's grammar,
    logits_processors and top_logprobs."""
    return generate_step(prompt, pair.without_drafter(), max_tokens=max_tokens, sampling=sampling,
                         prefill_step_size=prefill_step_size, prompt_cache=prompt_cache,
                         prompt_progress_callback=prompt_progress_callback, **rows)


def prefill(prompt: mx.array, pair: Pair, cache: DecodeCache, prefill_step_size: Optional[int] = None,
            prompt_progress_callback: Optional[Callable[[int, int], None]] = None) -> mx.array:
    """Run the whole prompt through the target (its features left for the drafter,
    `DecodeCache.unread`); return the last row's logits [V]. `prefill_chunks`, run to its end."""
    chunks = prefill_chunks(prompt, pair, cache, prefill_step_size, prompt_progress_callback)
    while True:
        try:
            next(chunks)
        except StopIteration as done:
            return done.value


def prefill_chunks(prompt: mx.array, pair: Pair, cache: DecodeCache, prefill_step_size: Optional[int] = None,
                   prompt_progress_callback: Optional[Callable[[int, int], None]] = None
                   ) -> Generator[int, None, mx.array]:
    """Run the prompt through the target (its features left for the drafter,
    `DecodeCache.unread`) chunk by chunk, yielding the tokens run so far after each chunk (a
    batch interleaves other sequences' cycles there); return the last row's logits [V].
    As mlx-lm: all tokens but the last in chunks of which only the caches are
    evaluated (so the last layer's MLP and the head never run on their rows),
    then the last token alone for its logits; bitwise the same on the CPU.
    `prefill_step_size` None: the backend's (`device.default_prefill_step_size`).
    `prompt_progress_callback(done, total)` is called with 0 first, then after
    each chunk has run (its caches evaluated), ending with `total`."""
    target, drafter = pair.target, pair.drafter
    total, step = prompt.size, prefill_step_size or default_prefill_step_size()
    # A target split over ranks runs the chunk's whole graph: a pipeline stage sends its
    # output only as part of it, and every rank must run the same collectives in order.
    split = getattr(target, "collectives", None) is not None
    if prompt_progress_callback is not None:
        prompt_progress_callback(0, total)
    ends = [*range(step, total - 1, step), total - 1, total]
    start = 0
    for end in ends[1:] if total == 1 else ends:
        logits, features = target(prompt[start:end][None], cache.target, pair.layer_ids, last_logits_only=True)
        # The prompt's features wait unread, after any an earlier run left: the drafter
        # reads them when someone drafts (or past FLUSH_ROWS rows, which bounds their memory).
        cache.hold_unread(features if drafter is not None else None)
        mx.eval([c.state for c in cache.target], [] if cache.unread is None else cache.unread, logits if split else [])
        if cache.unread is not None and cache.unread.shape[1] >= FLUSH_ROWS:
            cache.catch_up(drafter)
        mx.clear_cache()  # as mlx-lm: a chunk's freed buffers must not pile up into the next one's peak
        if prompt_progress_callback is not None and end != total - 1:  # the last token follows at once
            prompt_progress_callback(end, total)
        start = end
        if end != total:
            yield end
    return logits[0, -1]


def cache_for(prompt: mx.array, pair: Pair, prompt_cache: Optional[DecodeCache]) -> DecodeCache:
    """`prompt_cache`, checked to continue with `prompt`; else fresh caches."""
    if prompt_cache is not None:
        prompt_cache.check_continuation(prompt)
        return prompt_cache
    drafter = pair.drafter
    return DecodeCache(pair.target.make_cache(), drafter.make_cache() if drafter else None)


def check_prompt(prompt) -> mx.array:
    prompt = mx.array(prompt, dtype=mx.int32).reshape(-1)
    if prompt.size == 0:
        raise DFlashError("the prompt is empty: give some text to continue")
    return prompt
