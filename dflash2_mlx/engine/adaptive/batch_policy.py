"""Pick every running sequence's block for one batched cycle.

A batched cycle runs one target pass over the rows of every sequence (each
adds its anchor and drafted block, or one plain row) and one drafter pass over
every drafted block. Its cost depends on the total rows, not on who owns them:
on a GPU a pass over 64 rows costs little more than one, so every sequence can
draft; on this CPU a pass costs about in proportion to its rows, so under load
the rows drafting adds cost more than they commit and the batch decodes plainly.
Each cycle the policy picks the blocks b_i that maximise the batch's expected
committed tokens per second,

    sum_i E_i(b_i) / (target(sum_i b_i) + draft(sum_{b_i >= 2} b_i) + overhead + sum_i ctx_i(b_i)),

with E_i(1) = 1, E_i(b) the expected tokens of a b-row block (acceptance.py)
and ctx_i(b) what sequence i's context adds to its b rows (BatchCosts.per_context),
and never a choice expected to commit less per second than the batch decoding
plainly. Pure Python (no MLX): tested with injected tables, like policy.py.
"""

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from .acceptance import AcceptanceEstimate
from .costs import _interpolate

__all__ = ["BatchCosts", "BatchPolicy", "SequenceView"]

# Rounds of coordinate ascent after the best starting point (each gives every
# sequence its best block with the others held); it settles in two or three.
MAX_ROUNDS = 4
# Bounds of one pass's measured / predicted ratio, and the weight of each pass
# in the learned scale (the first pass of a kind after a run of the other gets
# FRESH_WEIGHT: its scale was last corrected before that run).
RATIO_BOUNDS = (0.25, 4.0)
FRESH_WEIGHT = 0.5


@dataclass(frozen=True)
class SequenceView:
    """What the policy needs to know of one running sequence."""

    tokens_left: int  # tokens it may still commit (>= 1)
    context: int  # tokens committed so far (its pass reads them all)
    max_block: int  # largest block it may draft (1: it cannot draft: no drafter, or forced plain)
    acceptance: AcceptanceEstimate  # its own estimate, already at its context band
    fixed: Optional[int] = None  # a block it must use this cycle (--block-size N, or a seeded sampled request)

    def top(self) -> int:
        """The largest block worth trying: a block of tokens_left + 1 rows can commit them all."""
        return max(1, min(self.max_block, self.tokens_left + 1))

    def expected(self) -> list[float]:
        """E(b) for b = 0..top (or the fixed block; index 0 unused): 1 for a plain row,
        else the acceptance's expected tokens capped at tokens_left."""
        cap = float(self.tokens_left)
        E = self.acceptance.expected_by_block(max(self.top(), self.fixed or 1))
        return [0.0, 1.0] + ([min(e, cap) for e in E[2:]] if E[-1] > cap else E[2:])


@dataclass(frozen=True)
class BatchCosts:
    """Seconds of one batched cycle's parts, by the total rows in them.

    `target`: one target pass over R rows in total (every sequence's rows,
    drafted blocks and plain rows alike); `draft`: one drafter pass (with the
    walk that turns it into tokens) over D drafted rows in total, 0 s for none;
    `overhead`: per cycle (the host sync, bookkeeping). Those three are measured
    at a short context. `per_context`: what one sequence's b rows add per token of
    its context past `context_from` (b = 1: a plain row; b >= 2: a drafted block,
    target and drafter pass together): every step reads its sequence's whole
    cache, so a long conversation's block costs more than a short one's (empty:
    not measured, every context costs as the short one). Sizes between measured
    ones are interpolated, beyond them extended linearly (costs._interpolate).
    """

    target: dict[int, float]
    draft: dict[int, float]
    overhead: float = 0.0
    per_context: dict[int, float] = field(default_factory=dict)
    context_from: int = 0

    def __post_init__(self):
        if not self.target or any(s <= 0 for s in self.target.values()) or self.overhead < 0:
            raise ValueError("batch costs need positive target pass times and a non-negative overhead")

    def target_cost(self, rows: int) -> float:
        return _interpolate(self.target, rows)

    def draft_cost(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        # No drafter pass was measured (a pair without a drafter): drafting is never chosen.
        return _interpolate(self.draft, rows) if self.draft else float("inf")

    def pass_cost(self, rows: int, drafted_rows: int) -> float:
        """Seconds of a cycle with `rows` target rows, `drafted_rows` of them drafted blocks
        (every sequence at the short context)."""
        return self.target_cost(rows) + self.draft_cost(drafted_rows) + self.overhead

    def context_cost(self, block: int, context: int) -> float:
        """What a sequence at `context` tokens adds to a cycle with its `block` rows, beyond
        the same rows at the short context."""
        extra = context - self.context_from
        return extra * _interpolate(self.per_context, block) if extra > 0 and self.per_context else 0.0

    def scaled(self, factor: float) -> "BatchCosts":
        def column(points):
            return {n: s * factor for n, s in points.items()}

        return BatchCosts(column(self.target), column(self.draft), self.overhead * factor,
                          column(self.per_context), self.context_from)

    def to_dict(self) -> dict:
        def column(points):
            return {str(n): s for n, s in sorted(points.items())}

        return {"target_s": column(self.target), "draft_s": column(self.draft), "overhead_s": self.overhead,
                "per_context_s": column(self.per_context), "context_from": self.context_from}

    @classmethod
    def from_dict(cls, d: dict) -> "BatchCosts":
        def column(key):
            return {int(n): float(s) for n, s in d.get(key, {}).items()}

        return cls(column("target_s"), column("draft_s"), float(d.get("overhead_s", 0.0)),
                   column("per_context_s"), int(d.get("context_from", 0)))


class BatchPolicy:
    """Chooses every sequence's block each cycle; 1 means a plain row.

    `choose(seqs)` returns one block per sequence, and is what the engine runs:
    the policy remembers whether that choice drafted. It rates every sequence
    plain (fixed ones at their block) against the best way of drafting it finds:
    every free sequence at the best common block, improved one sequence at a
    time (coordinate ascent; benchmarks/adaptive/batch_policy.py compares it with a
    brute-force search and times it). The answer is used only when its
    expected rate beats the plain one: by `margin` to start drafting, at all to
    keep drafting (the hysteresis BlockPolicy has, so noise near break-even does
    not flip every cycle). A fresh policy counts as drafting, as a fresh
    BlockPolicy does: one sequence alone gets BlockPolicy's first choice.

    With a `clock`, `observe_pass` corrects the costs by what the passes took:
    one factor for passes without a drafted row and one for passes with some,
    as BlockPolicy keeps one for plain steps and one for cycles. (A single
    factor over every pass would cancel out of every choice.) Without a clock
    the costs never move, so a seeded schedule is a function of the tokens.
    """

    def __init__(self, costs: BatchCosts, clock: Optional[Callable[[], float]] = None, margin: float = 0.03,
                 cost_weight: float = 0.1):
        self.costs, self.clock, self.margin, self.cost_weight = costs, clock, margin, cost_weight
        self.scale = {"plain": 1.0, "spec": 1.0}  # measured / calibrated seconds, learned online
        self.drafting = True  # the last choice drafted (a free sequence's block >= 2)
        self._target: list[float] = [0.0]  # unscaled seconds by rows (_tables)
        self._draft: list[float] = [0.0]
        self._per_token: list[float] = []  # unscaled per_context by block (_context_costs)
        self._chosen_context = 0.0  # what the contexts add to the cycle `choose` last answered for
        self._last_kind: Optional[str] = None  # the kind of the last observed pass
        self._chosen_at: Optional[float] = None  # the clock when `choose` last answered

    # -- the model --------------------------------------------------------------------
    def pass_cost(self, rows: int, drafted_rows: int, context: float = 0.0) -> float:
        """Predicted seconds of a cycle, with the learned scales; `context`: what the
        sequences' contexts add (unscaled seconds, `_context_costs`)."""
        T, D = self._tables(rows, drafted_rows)
        cost = T[rows] + D[drafted_rows] + self.costs.overhead + context
        return cost * self.scale["spec" if drafted_rows else "plain"]

    def _tables(self, rows: int, drafted_rows: int) -> tuple[list[float], list[float]]:
        """Unscaled seconds of a target pass by rows and of a drafter pass by drafted rows, each
        computed once (the search looks up hundreds of sizes a cycle)."""
        T, D = self._target, self._draft
        while len(T) <= rows:
            T.append(self.costs.target_cost(len(T)))
        while len(D) <= drafted_rows:
            D.append(self.costs.draft_cost(len(D)))
        return T, D

    def _context_costs(self, seqs: Sequence[SequenceView], E: list) -> list[list[float]]:
        """Per sequence and block (as E is indexed), the unscaled seconds its context adds."""
        K, longest = self._per_token, max(len(Ei) for Ei in E)
        while len(K) < longest:
            K.append(self.costs.context_cost(len(K), self.costs.context_from + 1))
        return [[extra * k for k in K[:len(Ei)]] if (extra := s.context - self.costs.context_from) > 0
                else [0.0] * len(Ei) for s, Ei in zip(seqs, E)]

    def rate(self, seqs: Sequence[SequenceView], blocks: Sequence[int]) -> float:
        """Expected committed tokens per second of `blocks` for `seqs`."""
        E = [s.expected() for s in seqs]
        return self._rate_of(E, self._context_costs(seqs, E), blocks)

    # -- the engine's calls ---------------------------------------------------------------
    def choose(self, seqs: Sequence[SequenceView]) -> list[int]:
        """One block per sequence (1: a plain row), for the cycle the engine runs now."""
        if self.clock is not None:
            self._chosen_at = self.clock()
        if not seqs:
            return []
        plain = [s.fixed if s.fixed is not None else 1 for s in seqs]
        free = [i for i, s in enumerate(seqs) if s.fixed is None and s.top() >= 2]
        if not free:
            self._chosen_context = sum(self._context_costs(seqs, [s.expected() for s in seqs])[i][b]
                                       for i, b in enumerate(plain))
            return plain
        E = [s.expected() for s in seqs]
        C = self._context_costs(seqs, E)
        plain_rate = self._rate_of(E, C, plain)
        blocks, rate = self._search(seqs, E, C, free, plain, plain_rate)
        # Never below the batch decoding plainly; start drafting only when it wins by `margin`.
        bar = plain_rate if self.drafting else plain_rate * (1.0 + self.margin)
        self.drafting = rate > bar and blocks != plain
        blocks = blocks if self.drafting else plain
        self._chosen_context = sum(C[i][b] for i, b in enumerate(blocks))
        return blocks

    def observe_pass(self, rows: int, drafted_rows: int, seconds: Optional[float] = None) -> None:
        """What the cycle just run took: `rows` target rows, `drafted_rows` of them drafted, in
        `seconds` (None: the clock's time since `choose` answered). Ignored without a clock."""
        if self.clock is None:
            return
        if seconds is None:
            if self._chosen_at is None:
                return
            seconds = self.clock() - self._chosen_at
        kind = "spec" if drafted_rows else "plain"
        predicted = self.pass_cost(rows, drafted_rows, self._chosen_context) / self.scale[kind]
        ratio = min(max(seconds / predicted, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
        weight = self.cost_weight if self._last_kind in (None, kind) else FRESH_WEIGHT
        self.scale[kind] += weight * (ratio - self.scale[kind])
        self._last_kind = kind

    # -- the search ---------------------------------------------------------------------
    def _search(self, seqs, E, C, free, start, start_rate) -> tuple[list[int], float]:
        """The best way of drafting found: every free sequence at one block b (capped at its
        top), the best b, then coordinate ascent; its blocks and rate, or `start`'s where
        that is better. The ascent starts from the best drafting start even where that loses
        to `start`: the drafter pass costs something however few rows it drafts, so where
        no sequence pays for it alone several together may, and one move at a time from
        `start` would never find them."""
        tops = [s.top() for s in seqs]
        best, rate = None, 0.0
        for b in range(2, max(tops[i] for i in free) + 1):
            trial = list(start)
            for i in free:
                trial[i] = b if b < tops[i] else tops[i]
            r = self._rate_of(E, C, trial)
            if r > rate:
                best, rate = trial, r
        if best is None:  # nothing can draft (no drafter pass was measured)
            return list(start), start_rate
        blocks, rate = self._ascend(E, C, free, tops, best, rate)
        return (blocks, rate) if rate > start_rate else (list(start), start_rate)

    def _rate_of(self, E, C, blocks) -> float:
        tokens = sum(E[i][b] for i, b in enumerate(blocks))
        context = sum(C[i][b] for i, b in enumerate(blocks))
        return tokens / self.pass_cost(sum(blocks), sum(b for b in blocks if b >= 2), context)

    def _ascend(self, E, C, free, tops, blocks, rate) -> tuple[list[int], float]:
        """Give each free sequence in turn the block that most raises the batch's rate with
        the others held, until a round changes nothing (sums kept, so a try is O(1))."""
        tokens = sum(E[i][b] for i, b in enumerate(blocks))
        context = sum(C[i][b] for i, b in enumerate(blocks))
        rows, drafted = sum(blocks), sum(b for b in blocks if b >= 2)
        T, D = self._tables(rows + sum(tops), drafted + sum(tops))
        overhead, plain, spec = self.costs.overhead, self.scale["plain"], self.scale["spec"]
        for _ in range(MAX_ROUNDS):
            moved = False
            for i in free:
                b0, Ei, Ci = blocks[i], E[i], C[i]
                t0, c0, r0 = tokens - Ei[b0], context - Ci[b0] + overhead, rows - b0
                d0 = drafted - (b0 if b0 >= 2 else 0)
                best, best_rate = b0, rate
                for b in range(1, tops[i] + 1):
                    if b == b0:
                        continue
                    d = d0 + b if b >= 2 else d0
                    r = (t0 + Ei[b]) / ((T[r0 + b] + D[d] + c0 + Ci[b]) * (spec if d else plain))
                    if r > best_rate:
                        best, best_rate = b, r
                if best != b0:
                    blocks[i], rate, moved = best, best_rate, True
                    tokens, context = t0 + Ei[best], c0 - overhead + Ci[best]
                    rows, drafted = r0 + best, d0 + (best if best >= 2 else 0)
            if not moved:
                break
        return blocks, rate
