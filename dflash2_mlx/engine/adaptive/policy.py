"""Pick each cycle's block size from measured costs and observed acceptance.

Pure Python (no MLX), so the policy can be tested with injected cost tables.
A cycle at block size B costs draft(B) + verify(B) seconds and commits
E_B = 1 + sum_k prod_{t<=k} alpha_t tokens on average, where alpha_t is the
chance that draft position t is accepted once every earlier one was. A plain
decoding step costs `plain` seconds and commits one token. Each cycle takes
the block size with the most expected tokens per second; when no block size
beats plain decoding the loop decodes plainly and probes again now and then,
spending at most `probe_budget` of its time on probes that lose.

The choice never changes what is generated, only how fast: every cycle,
speculative or plain, commits tokens from the target's own distribution.
"""

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Optional, Sequence


def _interpolate(points: dict[int, float], B: int) -> float:
    """Linear in B between measured sizes, extended from the outermost two."""
    if B in points:
        return points[B]
    sizes = sorted(points)
    if len(sizes) == 1:
        return points[sizes[0]]
    lo, hi = sizes[0], sizes[1]
    for a, b in zip(sizes, sizes[1:]):
        lo, hi = a, b
        if B < b:
            break
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[lo] + slope * (B - lo), 0.0)


@dataclass(frozen=True)
class CostTable:
    """Measured seconds of a decode cycle on one machine for one pair.

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


class AcceptanceEstimate:
    """Per-position conditional acceptance, from decayed counts.

    Starts from `seed` (e.g. a calibration probe) worth `prior_weight` cycles;
    each observed cycle first decays every count by `decay`, so the estimate
    follows the text being generated. Positions a cycle did not reach (an
    earlier draft was rejected, or the block was shorter) are left alone.
    """

    def __init__(self, positions: int, seed: Sequence[float] = (), prior_weight: float = 4.0,
                 decay: float = 0.95, default: float = 0.5):
        seed = list(seed) or [default]
        # Past the seed's last position assume its last rate (acceptance decays slowly with depth).
        rates = [min(max(seed[min(t, len(seed) - 1)], 0.0), 1.0) for t in range(positions)]
        self.reached = [prior_weight] * positions
        self.hit = [r * prior_weight for r in rates]
        self.decay = decay
        self._expected: Optional[list[float]] = None  # expected_tokens by B, until the next observe

    def observe(self, drafted: int, accepted: int) -> None:
        self._expected = None
        self.reached = [r * self.decay for r in self.reached]
        self.hit = [h * self.decay for h in self.hit]
        for t in range(min(accepted + 1, drafted, len(self.reached))):
            self.reached[t] += 1.0
            if t < accepted:
                self.hit[t] += 1.0

    @property
    def rates(self) -> list[float]:
        return [h / r if r > 0 else 0.0 for h, r in zip(self.hit, self.reached)]

    def expected_tokens(self, B: int) -> float:
        """Mean tokens a B-row cycle commits (accepted drafts + the bonus)."""
        if self._expected is None:
            # Every B at once: the policy asks for each B at every plain step.
            totals, total, run = [1.0, 1.0], 1.0, 1.0
            for alpha in self.rates:
                run *= alpha
                total += run
                totals.append(total)
            self._expected = totals
        return self._expected[max(min(B, len(self._expected) - 1), 1)]


@dataclass
class PolicyReport:
    """What the policy did, for stats and the closing line."""

    fallbacks: list[tuple[int, str]] = field(default_factory=list)  # (token index, why)
    probes: int = 0


class Mode(Enum):
    """Where a `BlockPolicy` stands between two decisions."""

    DRAFTING = "drafting"  # speculative cycles while they beat plain decoding
    WAITING = "waiting"  # plain steps; a probe cycle after `plain_left` more
    PROBING = "probing"  # a probe cycle is running; its outcome decides what follows
    PLAIN_ONLY = "plain only"  # no block can ever beat plain decoding: never probe
    RETIMING = "retiming"  # a few plain steps while drafting, to time plain decoding now


# Plain steps of one re-timing run (the first is only launched before the next
# decision, so it is not timed), and the weight each timed one gets.
RETIME_STEPS = 3
RETIME_WEIGHT = 0.5
# Cycles before the first re-timing of a run (a cheap check of the calibration
# at the start), and the bounds of the interval after that.
RETIME_FIRST, RETIME_MAX = 4, 256
# How far plain decoding's cost relative to a cycle's must move after a losing probe before
# re-measured costs may start the next probe early.
EARLY_PROBE_SHIFT = 1.25


@dataclass(frozen=True)
class Decision:
    """One cycle's block and the policy state it leads to, computed without
    changing the policy; `record` makes it happen. (A `decode.state.Choice`
    with more to say; this module stays free of MLX.)"""

    block: int  # 1: a plain decoding step
    mode: Mode = Mode.DRAFTING
    plain_left: int = 0  # plain steps before the next probe (WAITING)
    fallback: Optional[str] = None  # why drafting stopped, when it stops with this decision


@dataclass(frozen=True)
class _Timed:
    at: float  # clock reading when the decision was recorded
    block: int
    previous: Optional[int]  # the block decided before it
    retiming: bool = False  # a plain step of a re-timing run


class BlockPolicy:
    """Chooses the block size of every cycle; 1 means a plain decoding step.

    `choose(tokens_left)` is asked before each cycle and changes nothing;
    `record(decision)` commits the decision the loop acts on;
    `observe(drafted, accepted)` is told the outcome of every speculative cycle.

    With a `clock`, the time between consecutive recorded decisions is what
    the earlier one cost (the consumer's share of each token included), and
    the calibrated costs are scaled online, one factor for plain steps and one
    for cycles: the calibration was measured once, on a short context and
    maybe while the machine was busy; this run's costs are what count. While
    it drafts, no plain step runs, so now and then (after `RETIME_FIRST`
    cycles, then at doubling intervals up to `RETIME_MAX`) it runs a few plain
    steps to time plain decoding again: a stale plain cost cannot make a
    drafting choice that measures slower than plain decoding look better.
    The first re-timing comes after `RETIME_FIRST` cycles; later ones are
    spaced so that they cost at most `probe_budget` of the time (a plain step
    loses little where drafting's lead is small, which is where a stale plain
    cost can mislead).
    While it decodes plainly, re-measured costs that make drafting pay start
    a probe at once, unless a probe has lost since and the costs have not
    moved by EARLY_PROBE_SHIFT from what they were then.
    """

    def __init__(self, costs: CostTable, max_block: int, acceptance: Optional[AcceptanceEstimate] = None,
                 margin: float = 0.03, probe_budget: float = 0.02, max_probe_interval: int = 4096,
                 clock: Optional[Callable[[], float]] = None, cost_weight: float = 0.1):
        if max_block < 2:
            raise ValueError(f"max_block {max_block} must be at least 2")
        self.costs, self.max_block = costs, max_block
        # Interpolated once: `choose` rates every block size before each step.
        self._cycle = {B: costs.cycle(B) for B in range(2, max_block + 1)}
        self.acceptance = acceptance or AcceptanceEstimate(max_block - 1)
        self.margin, self.probe_budget, self.max_probe_interval = margin, probe_budget, max_probe_interval
        self.report = PolicyReport()
        self.tokens = 0  # tokens committed through this policy so far
        self.mode = Mode.DRAFTING
        self.plain_left = 0  # plain steps until the next probe, in WAITING
        self._losing_probes = 0
        self.clock, self.cost_weight = clock, cost_weight
        self.scale = {"plain": 1.0, "spec": 1.0}  # measured / calibrated cost, learned online
        self._last: Optional[_Timed] = None
        self._cycles_to_retime = RETIME_FIRST
        self._verdict: Optional[float] = None  # plain / cycle cost scale when the last probe lost
        self._probe_loss = 0.0  # plain steps the last probe lost, measured (0 without a clock)

    # -- the model -----------------------------------------------------------------
    def plain_cost(self) -> float:
        return self.costs.plain * self.scale["plain"]

    def cycle_cost(self, B: int) -> float:
        return self._cycle[B] * self.scale["spec"]

    def rate(self, B: int) -> float:
        """Expected committed tokens per second at block size B (1: plain)."""
        if B <= 1:
            return 1.0 / self.plain_cost()
        return self.acceptance.expected_tokens(B) / self.cycle_cost(B)

    def best_block(self, tokens_left: int) -> int:
        """The speculative block size with the highest expected rate."""
        top = max(2, min(self.max_block, tokens_left + 1))
        return max(range(2, top + 1), key=lambda B: (self.rate(B), -B))

    def _can_ever_win(self) -> bool:
        # Even if every draft were accepted (B tokens per cycle) plain decoding is faster.
        return any(B / self.cycle_cost(B) > self.rate(1) for B in range(2, self.max_block + 1))

    # -- the loop's calls --------------------------------------------------------------
    def choose(self, tokens_left: int) -> Decision:
        """The next cycle's block size (1: plain), and the state it leads to."""
        if tokens_left <= 1:
            return self._plain_step(self.mode, self.plain_left)
        if self.mode is Mode.RETIMING and self.plain_left > 0:
            return Decision(1, Mode.RETIMING, self.plain_left - 1)
        if self.mode in (Mode.WAITING, Mode.PLAIN_ONLY, Mode.PROBING):
            waiting = self.mode is Mode.PLAIN_ONLY or (self.mode is Mode.WAITING and self.plain_left > 0)
            if waiting and not (self.clock is not None and self._pays_by_margin(tokens_left) and self._new_evidence()):
                return self._plain_step(self.mode, self.plain_left)
            return Decision(self.best_block(tokens_left), Mode.PROBING)
        if self.clock is not None and self.mode is Mode.DRAFTING and self._cycles_to_retime <= 0:
            return Decision(1, Mode.RETIMING, RETIME_STEPS - 1)
        B = self.best_block(tokens_left)
        # Hysteresis: keep drafting while it beats plain decoding at all; start
        # again (after a probe) only when it beats it by `margin`.
        if self.rate(B) > self.rate(1):
            return Decision(B)
        mode, wait = self._next_probe(B)
        return replace(self._plain_step(mode, wait), fallback=self._why_plain(B))

    def record(self, decision: Decision) -> None:
        """Act on `decision`: the loop runs it now."""
        if decision.fallback is not None:
            self.report.fallbacks.append((self.tokens, decision.fallback))
        if decision.mode is Mode.PROBING:  # only a probe cycle leads there
            self.report.probes += 1
        if decision.block == 1:
            self.tokens += 1
        if decision.mode is Mode.RETIMING and self.mode is not Mode.RETIMING:
            self._cycles_to_retime = self._retime_interval()
        self.mode, self.plain_left = decision.mode, decision.plain_left
        self._tick(decision.block)

    def observe(self, drafted: int, accepted: int) -> None:
        # What this cycle itself committed per second, against plain decoding (before the
        # acceptance estimate moves): a probe that beat it is worth following up soon.
        beat_plain = (accepted + 1) / self.cycle_cost(min(drafted + 1, self.max_block)) > self.rate(1)
        self.acceptance.observe(drafted, accepted)
        self.tokens += accepted + 1
        if self.mode is Mode.DRAFTING:
            self._cycles_to_retime -= 1
        if self.mode is not Mode.PROBING:
            return
        if self.clock is not None and self._last is not None:
            # What this probe lost, as the clock saw it (its draft takes the pending
            # rows of the plain run into the drafter's cache, which no calibrated
            # cycle pays): the next probe is spaced by this when it is the larger.
            spent = (self.clock() - self._last.at) / self.plain_cost()
            self._probe_loss = max(spent - (accepted + 1), 0.0)
        B = self.best_block(self.max_block)
        if self._pays_by_margin(self.max_block):
            self.mode, self._losing_probes = Mode.DRAFTING, 0  # drafting pays again
        else:
            # Back off while probes lose; one that itself beat plain decoding is
            # followed up at the base interval. (Not "better than expected": at a
            # small block half the probes beat the mean, so the backoff never grew.)
            self._losing_probes = 0 if beat_plain else self._losing_probes + 1
            self.mode, self.plain_left = self._next_probe(B)
            self._verdict = self.scale["plain"] / self.scale["spec"]

    # -- internals --------------------------------------------------------------------
    def _retime_interval(self) -> int:
        """Cycles until the next re-timing, so that its plain steps cost at most
        `probe_budget` of the time drafting takes meanwhile."""
        B = self.best_block(self.max_block)
        lead = max(self.rate(B) / self.rate(1), 1.0)
        loss = RETIME_STEPS * self.plain_cost() * (1.0 - 1.0 / lead)
        cycles = math.ceil(loss / (self.probe_budget * self.cycle_cost(B)))
        return min(max(cycles, RETIME_FIRST), RETIME_MAX)

    def _new_evidence(self) -> bool:
        """Whether plain decoding's cost, relative to a cycle's, has moved by EARLY_PROBE_SHIFT
        since the last probe lost: only then may re-measured costs start a probe before its wait
        is over. (A busy spell slows the plain steps it times and the cycles it does not; without
        this each step of it would start another losing probe.)"""
        return self._verdict is None or self.scale["plain"] / self.scale["spec"] > self._verdict * EARLY_PROBE_SHIFT

    def _pays_by_margin(self, tokens_left: int) -> bool:
        return self.rate(self.best_block(tokens_left)) > self.rate(1) * (1.0 + self.margin)

    @staticmethod
    def _plain_step(mode: Mode, plain_left: int) -> Decision:
        """A plain step, one nearer to the next probe while waiting for one."""
        if mode is Mode.PROBING:  # a probe that was never observed: probe again
            mode = Mode.WAITING
        return Decision(1, mode, max(plain_left - 1, 0) if mode is Mode.WAITING else 0)

    def _tick(self, B: int) -> None:
        """Charge the time since the previous decision to that decision."""
        if self.clock is None:
            return
        now = self.clock()
        last = self._last
        # The first plain step after a cycle is only launched, not waited for,
        # before the next decision: its interval says nothing.
        if last is not None and (last.block > 1 or last.previous == 1):
            predicted = self.costs.plain if last.block == 1 else self.costs.cycle(last.block)
            ratio = min(max((now - last.at) / predicted, 0.25), 4.0)
            key = "plain" if last.block == 1 else "spec"
            weight = RETIME_WEIGHT if last.retiming else self.cost_weight
            self.scale[key] += weight * (ratio - self.scale[key])
        self._last = _Timed(now, B, last.block if last else None, self.mode is Mode.RETIMING)

    def _why_plain(self, B: int) -> str:
        E, cost = self.acceptance.expected_tokens(B), self.cycle_cost(B) / self.plain_cost()
        if not self._can_ever_win():
            return (f"even a fully accepted block cannot beat plain decoding here (a {B}-token cycle "
                    f"costs {cost:.1f} plain steps)")
        return (f"the best block, {B}, is expected to commit {E:.2f} tokens per cycle at the cost of "
                f"{cost:.1f} plain steps ({E / cost:.2f}x plain decoding)")

    def _next_probe(self, B: int) -> tuple[Mode, int]:
        """Wait long enough that a losing probe costs at most `probe_budget` of the time."""
        if not self._can_ever_win():
            return Mode.PLAIN_ONLY, 0
        loss = max(self.cycle_cost(B) / self.plain_cost() - self.acceptance.expected_tokens(B), self._probe_loss)
        wait = math.ceil(loss / self.probe_budget) * (2 ** self._losing_probes)
        return Mode.WAITING, max(1, min(wait, self.max_probe_interval))


def auto_decides(pair, block_size, tree_rows: int = 0) -> bool:
    """Whether `block_size="auto"` picks each cycle's block size for `pair`: it
    needs a drafter and a chain (a tree drafts the drafter's fixed block, and
    the cost model is the chain's), and is the one rule every caller asks."""
    return block_size == "auto" and pair.drafter is not None and not tree_rows
