"""The decode loop. It knows nothing about text: token ids in, token ids out.

Chunked prefill, then cycles: the policy chooses each cycle's block size
(1 = a plain step), the cycle runs (a chain, a tree or a plain step) and
returns a `CycleOutcome`, and one tail commits it and yields a `DecodeStep`
(docs/algorithm.md §5). Without a drafter every cycle is a plain step, which
is `--ar`. The loop leaves its caches consistent when closed early.
"""

from typing import Callable, Generator, Optional

import mlx.core as mx

from ...device import default_prefill_step_size
from ..pair import Pair
from ..tree.cycle import tree_cycle
from .chain import chain_cycle
from .plain import PlainStep
from .profile import CycleProfiler
from .sequence import SequenceRun
from .state import FLUSH_ROWS, DecodeCache, DecodePlan, DecodeStep

__all__ = ["DecodeCache", "DecodeStep", "generate_step"]


def generate_step(
    prompt,
    pair: Pair,
    plan: DecodePlan,
    *,
    prompt_cache: Optional[DecodeCache] = None,
    profiler: Optional[CycleProfiler] = None,
    prompt_progress_callback: Optional[Callable[[int, int], None]] = None,
) -> Generator[DecodeStep, None, None]:
    """Lossless decoding of `pair` as `plan` (engine/plan.py) says; yields one step per
    target pass. Without a drafter every cycle is a plain step (`--ar`).
    `prompt_cache` holds earlier context; `prompt` then starts with its last
    committed token. `prompt_progress_callback(done, total)`: mlx-lm's.
    The cycle order (when to decide, the key splits, the commit) is `SequenceRun`'s.
    """
    run = SequenceRun(pair, prompt, plan, prompt_cache, profiler)
    cache, profiler, rule, sample = run.cache, run.profiler, run.rule, run.sample
    last = prefill(run.prompt, pair, cache, plan.prefill_step_size, prompt_progress_callback)
    run.prefilled()
    plain = PlainStep.sampled(last, cache, sample, run.prefill_key, rule, rows=0)
    try:
        while True:
            if plain is not None:
                # Decide what follows before fetching this token, so a plain
                # next step can be launched first.
                run.decide_before_commit()
                ahead = None
                if run.plain_next and not (rule is not None and rule.needs_tokens):
                    ahead = PlainStep.launch(pair, cache, plain.token, sample, run.next_keys(False)[0], rule)
                outcome, plain = plain.finish(profiler), ahead
                run.commit(outcome, plain=True, decided=True)
            else:
                k_draft, k_accept = run.next_keys(True)
                tree, block = run.cycle_shape(run.choice.block)
                cycle = dict(block=block, sampling=run.sampling, transform=run.transform, left=run.left,
                             profiler=profiler)
                if tree:
                    outcome = tree_cycle(pair, cache, run.anchor, run.pending.take(), rows=run.tree_rows, key=k_accept,
                                         rule=rule, **cycle)
                else:
                    outcome = chain_cycle(pair, cache, run.anchor, run.pending.take(), (k_draft, k_accept), rule,
                                          **cycle)
                run.commit(outcome, plain=False)
            yield outcome.step()
            if plain is None and run.plain_next:
                anchor = mx.array([run.anchor], dtype=mx.int32)
                plain = PlainStep.launch(pair, cache, anchor, sample, run.next_keys(False)[0], rule)
            if plain is None and run.choice is None:
                return
    finally:
        if plain is not None:  # closed early: undo the look-ahead row
            plain.cancel(pair, cache)
        run.close()


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
