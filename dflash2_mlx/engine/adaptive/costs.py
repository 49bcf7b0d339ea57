"""What a decode cycle costs, by block size and by how much context it reads.

A decode step reads every cached row, so its cost grows with the context:
on Apple GPUs a long context makes the verify pass memory-bound and
drafting can turn from a gain into a loss (oMLX measured 2.11x at 2k and
0.56x at 32k). `CostTable` holds the costs measured at one context length;
`ContextCosts` holds tables measured at two or more and gives the table at
any context by interpolating linearly between them, and extending the last
two linearly beyond (attention's per-step cost is linear in the context).
Pure Python, so the policy can be tested with injected tables.
"""

from dataclasses import dataclass
from typing import Optional, Union


def _interpolate(points: dict[int, float], x: int) -> float:
    """Linear between measured points, extended from the outermost two (upwards only, past the last)."""
    if x in points:
        return points[x]
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    lo, hi = xs[0], xs[1]
    for a, b in zip(xs, xs[1:]):
        lo, hi = a, b
        if x < b:
            break
    slope = (points[hi] - points[lo]) / (hi - lo)
    if x > hi:
        # Past the last point, never downhill: a longer context or a bigger block costs no less.
        # (A busy spell during the shorter measurement makes the two points fall; extended, that
        # reached zero at a long context, and a zero cost is no cost table.)
        return points[hi] + max(slope, 0.0) * (x - hi)
    return max(points[lo] + slope * (x - lo), 0.0)


@dataclass(frozen=True)
class CostTable:
    """Measured seconds of a decode cycle on one machine for one pair, at one context length.

    `plain` is one plain decoding step. `verify` is a target pass over B rows
    with the drafter's layers captured; `draft` is a drafter pass over a B-row
    block plus the walk that turns it into draft tokens. `cycles`, when
    measured, is a whole speculative cycle as the loop runs it (graph
    building, the host sync, bookkeeping; pieces may overlap) and is what
    `cycle` returns; otherwise verify + draft. Sizes in between measured ones
    are interpolated.
    """

    plain: float
    verify: dict[int, float]
    draft: dict[int, float]
    cycles: Optional[dict[int, float]] = None

    def __post_init__(self):
        if self.plain <= 0 or not self.verify or not self.draft:
            raise ValueError("a cost table needs a positive plain step time and verify/draft times")

    def cycle(self, B: int) -> float:
        """Seconds of one speculative cycle at block size B."""
        if self.cycles:
            return _interpolate(self.cycles, B)
        return _interpolate(self.verify, B) + _interpolate(self.draft, B)

    def at(self, context: int) -> "CostTable":
        """The table at `context` rows: one table says nothing about context, so itself."""
        return self

    @property
    def contexts(self) -> dict[int, "CostTable"]:
        return {0: self}

    def scaled(self, factor: float) -> "CostTable":
        def column(points):
            return None if points is None else {B: s * factor for B, s in points.items()}

        return CostTable(self.plain * factor, column(self.verify), column(self.draft), column(self.cycles))

    def to_dict(self) -> dict:
        def column(points):
            return {str(B): s for B, s in sorted(points.items())}

        d = {"plain_s": self.plain, "verify_s": column(self.verify), "draft_s": column(self.draft)}
        if self.cycles:
            d["cycle_s"] = column(self.cycles)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CostTable":
        def column(key):
            return {int(B): float(s) for B, s in d[key].items()} if key in d else None

        return cls(float(d["plain_s"]), column("verify_s"), column("draft_s"), column("cycle_s"))


@dataclass(frozen=True)
class ContextCosts:
    """Cost tables measured at several context lengths (rows the target cache
    holds when the step runs); `at(context)` interpolates every cost in context."""

    tables: dict[int, CostTable]

    def __post_init__(self):
        if not self.tables:
            raise ValueError("context costs need at least one measured table")

    @property
    def contexts(self) -> dict[int, CostTable]:
        return dict(sorted(self.tables.items()))

    def at(self, context: int) -> CostTable:
        if len(self.tables) == 1:
            return next(iter(self.tables.values()))
        lo = min(self.tables)
        x = max(context, lo)  # below the shortest measured context, its table
        first = self.tables[lo]

        def column(get):
            points = {c: get(t) for c, t in self.tables.items()}
            sizes = set.intersection(*(set(p) for p in points.values()))  # measured at every context
            return {B: _interpolate({c: p[B] for c, p in points.items()}, x) for B in sorted(sizes)}

        cycles = column(lambda t: {B: t.cycle(B) for B in (t.cycles or t.verify)}) if first.cycles else None
        return CostTable(_interpolate({c: t.plain for c, t in self.tables.items()}, x),
                         column(lambda t: t.verify), column(lambda t: t.draft), cycles)

    def scaled(self, factor: float) -> "ContextCosts":
        return ContextCosts({c: t.scaled(factor) for c, t in self.tables.items()})

    def to_dict(self) -> dict:
        return {"by_context": {str(c): t.to_dict() for c, t in sorted(self.tables.items())}}


Costs = Union[CostTable, ContextCosts]


def costs_from_dict(d: dict) -> Costs:
    """A `ContextCosts` (`{"by_context": {...}}`) or a single `CostTable`, as written by `to_dict`."""
    if "by_context" in d:
        return ContextCosts({int(c): CostTable.from_dict(t) for c, t in d["by_context"].items()})
    return CostTable.from_dict(d)


def non_decreasing(points: dict[int, float]) -> dict[int, float]:
    """Least-squares fit that never falls as B grows (pool adjacent violators):
    a longer block never costs less, so a dip is noise (another process took
    the machine for a moment) and would mislead the policy."""
    blocks = [[points[B], 1, [B]] for B in sorted(points)]  # [mean, weight, sizes]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            a, b = blocks[i], blocks.pop(i + 1)
            a[0] = (a[0] * a[1] + b[0] * b[1]) / (a[1] + b[1])
            a[1] += b[1]
            a[2] += b[2]
            i = max(i - 1, 0)
        else:
            i += 1
    return {B: mean for mean, _, sizes in blocks for B in sizes}
