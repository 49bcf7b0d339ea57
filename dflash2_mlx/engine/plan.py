"""A request's plan: what one generation decodes with, worked out before anything runs.

`plan(pair, request, calibration)` (a `decode.state.DecodePlan`) checks what depends on the loaded pair (a
block the drafter can draft, a tree its lattice fills, the room left in the
context) and settles every choice the loops would otherwise each make: the
block (fixed, or the most auto may draft), the block policy (a tree drafts
the fixed block: the cost model is the chain's), the tree rows, a fresh
grammar state and the rows' rule. The single-sequence loop and the batch
decoder take the plan whole. `calibration_for` is the orchestration every
front end shares: it reads (or measures once, and keeps) the machine's
costs that `block_size="auto"` needs.
"""

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Optional, Sequence

from ..errors import DFlashError
from .adaptive.policy import auto_decides
from .decode.rows import RowRule
from .decode.state import DecodePlan, FixedBlock
from .grammar import GrammarState
from .pair import Pair
from .request import DecodeRequest, RequestError
from .target.context import check_context
from .tree.cycle import tree_rows_for
from .tree.shape import ShapeChoice

__all__ = ["DecodePlan", "plan", "calibration_for", "Calibrated"]


def plan(pair: Pair, request: DecodeRequest, calibration=None, *, prompt_ids: Sequence[int] = (),
         history: int = 0, tokenizer=None, batched: bool = False) -> DecodePlan:
    """The plan for `request` on `pair`: `prompt_ids` follow `history` tokens already
    in a prompt cache (they fill the context together); `tokenizer` is needed for a
    grammar; `batched`: it runs in a batch, whose policy keeps the clock. Auto
    without a `calibration` measures the costs now, in memory (`calibration_for`
    keeps them on disk)."""
    room = check_context(pair.target, history + len(prompt_ids))  # before calibration and prefill
    max_tokens = request.max_tokens if room is None else min(request.max_tokens, room)  # a full context: "length"
    block, tree = fit(pair, request)
    auto = auto_decides(pair, request.block_size, tree)
    policy = None
    if auto and max_tokens > 1:
        # Seeded sampling: a schedule that does not depend on the clock, so the
        # same seed gives the same tokens (docs/adaptive.md, "Seeds reproduce").
        clock = None if request.sampling.seeded or batched else time.perf_counter
        policy = (calibration or _measure(pair, prompt_ids)).policy(block, clock=clock)
    if policy is None:
        policy = FixedBlock(block)
    grammar = None
    if request.grammar is not None:
        grammar = GrammarState(request.grammar, tokenizer, pair.target.vocab_size)
    rule = None
    if grammar is not None or request.logits_processors or request.top_logprobs is not None:
        rule = RowRule(request.logits_processors, grammar, request.top_logprobs)
    # Sampled, a tree can commit less than the chain of its rows: measured per cycle (tree/shape.py).
    shape = ShapeChoice() if tree and not request.sampling.greedy else None
    return DecodePlan(request, max_tokens, block, auto, policy, tree,
                      batch_decides=auto and not request.sampling.seeded, grammar=grammar, rule=rule, shape=shape)


def fit(pair: Pair, request: DecodeRequest) -> tuple[int, int]:
    """(block, tree rows) of `request` on `pair`, checked against what its drafter can
    draft: the block (the fixed one, or the most auto may draft) and the rows of a
    tree its lattice fills (0: the chain; the chain too, with a warning, for a target
    that cannot branch in one pass). A pair without a drafter decodes plainly."""
    if pair.drafter is None:
        return 1, 0
    # The pair's rules (Pair.block_size, check_tree_rows), told as the field's.
    try:
        block = pair.block_size(None if request.block_size in (None, "auto") else request.block_size, "block_size")
    except DFlashError as e:
        raise RequestError("block_size", str(e)) from None
    try:
        tree = tree_rows_for(pair, request.tree_rows) if request.tree_rows else 0
    except DFlashError as e:
        raise RequestError("tree_rows", str(e)) from None
    return block, tree


def _measure(pair: Pair, prompt_ids):
    from .adaptive.calibrate import measure

    return measure(pair, prompt_ids)


@dataclass(frozen=True)
class Calibrated:
    """What `calibration_for` settled: the request to run (ranks decode a fixed
    block), the calibration auto reads (None: none needed) and a note for the
    user (the cached costs were rescaled), if any."""

    request: DecodeRequest
    calibration: object = None
    note: Optional[str] = None


def calibration_for(pair: Pair, request: DecodeRequest, folder: Optional[Path], prompt_ids: Sequence[int], *,
                    recalibrate: bool = False, ranks: bool = False, first: bool = False,
                    measuring: Callable[[], ContextManager] = contextlib.nullcontext) -> Calibrated:
    """The calibration `request` needs on `pair`, read from `folder` (or measured
    first, once per machine and pair, and kept there: seconds for a small pair,
    minutes for a real model on one CPU core). `first`: a first estimate will do
    when nothing is cached (`adaptive.calibrate.first_estimate`: seconds, so a
    first answer does not wait; the doctor and the server measure fully).
    `measuring()` wraps a measurement (a front end shows that it is under way).
    Ranks of a split target decode the drafter's fixed block: auto decides from
    each rank's own clock, and ranks that decided differently would wait forever
    on each other's collectives."""
    if pair.drafter is None or not request.auto:
        return Calibrated(request)
    if ranks:
        return Calibrated(request.replace(block_size=None))
    if (request.max_tokens <= 1 or not auto_decides(pair, request.block_size, request.tree_rows)) and not recalibrate:
        return Calibrated(request)  # no cycle will run, or none that auto decides
    from .adaptive.calibrate import load_or_calibrate, read_calibration

    cached = None if recalibrate or folder is None else read_calibration(pair, folder)
    fresh = cached is None or not (cached.complete or first)  # something will be measured now
    # A seeded run skips the start-up check: a timing would tie its schedule to the clock.
    with (measuring() if fresh else contextlib.nullcontext()):
        calibration = load_or_calibrate(pair, folder, prompt_ids, recalibrate, check=not request.sampling.seeded,
                                        first=first)
    note = None
    if fresh and not calibration.complete:
        note = ("decode costs: a first estimate, corrected as it decodes; `dflash2 doctor` measures them fully "
                "(minutes for a real model on a CPU)")
    elif calibration.rescaled is not None:
        note = (f"decode costs rescaled {calibration.rescaled:.2f}x: a plain step timed now disagreed with the "
                "cached calibration; `dflash2 doctor --recalibrate` measures them again")
    return Calibrated(request, calibration, note)
