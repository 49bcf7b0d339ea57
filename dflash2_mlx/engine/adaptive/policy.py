"""Pick each cycle's block size from measured costs and observed acceptance.

Pure Python (no MLX), so the policy can be tested with injected cost tables.
A cycle at block size B costs draft(B) + verify(B) seconds and commits
E_B = 1 + sum_k prod_{t<=k} alpha_t tokens on average, where alpha_t is the
chance that draft position t is accepted once every earlier one was. A plain
decoding step costs `plain` seconds and commits one token. Each cycle takes
the block size with the most expected tokens per second; when no block size
beats plain decoding the loop decodes plainly and probes again now and then,
spending at most `probe_budget` of its time on probes that lose.
Both the costs and the acceptance depend on the context the step reads
(costs.py, acceptance.py): the loop says how long it is at every decision.

The choice never changes what is generated, only how fast: every cycle,
speculative or plain, commits tokens from the target's own distribution.
"""

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Optional

from .acceptance import AcceptanceEstimate, BandedAcceptance
from .costs import ContextCosts, Costs, CostTable

__all__ = ["AcceptanceEstimate", "BlockPolicy", "ContextCosts", "CostTable", "Decision", "Mode", "auto_decides"]


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
# A timed cycle this far from the table (either way) times plain decoding at once.
SUSPECT_RATIO = 1.2
# How far plain decoding's cost relative to a cycle's must move after a losing probe before
# re-measured costs may start the next probe early.
EARLY_PROBE_SHIFT = 1.25
# Context rows between two look-ups of the costs and the acceptance band.
CONTEXT_STEP = 64
# Past this many times the longest calibrated context the costs are a linear extension that
# timing noise in the calibration can put several times off: plain decoding is timed before
# the first cycle there, a cycle is taken to be off by what a plain step was until one is
# timed, and this run's first timings replace the calibrated costs rather than average with
# them.
EXTENDED = 2.0


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

    def __init__(self, costs: Costs, max_block: int, acceptance: Optional[AcceptanceEstimate] = None,
                 margin: float = 0.03, probe_budget: float = 0.02, max_probe_interval: int = 4096,
                 clock: Optional[Callable[[], float]] = None, cost_weight: float = 0.1):
        if max_block < 2:
            raise ValueError(f"max_block {max_block} must be at least 2")
        self.max_block = max_block
        self.by_context, self._bands = costs, BandedAcceptance(acceptance or AcceptanceEstimate(max_block - 1))
        measured = costs.contexts
        # One table says nothing about context: never an extension.
        self._longest_measured = max(measured) if len(measured) > 1 else None
        self.context = None  # the context the costs below are for (None: not told yet)
        self.use_context(0)
        self.margin, self.probe_budget, self.max_probe_interval = margin, probe_budget, max_probe_interval
        self.report = PolicyReport()
        self.tokens = 0  # tokens committed through this policy so far
        self.mode = Mode.DRAFTING
        self.plain_left = 0  # plain steps until the next probe, in WAITING
        self._losing_probes = 0
        self.clock, self.cost_weight = clock, cost_weight
        self.scale = {"plain": 1.0, "spec": 1.0}  # measured / calibrated cost, learned online
        self._timed = {"plain": 0, "spec": 0}  # intervals timed so far, of each kind
        self._last: Optional[_Timed] = None
        self._cycles_to_retime = RETIME_FIRST
        self._verdict: Optional[float] = None  # plain / cycle cost when the last probe lost
        self._probe_loss = 0.0  # plain steps the last probe lost, measured (0 without a clock)

    def use_context(self, context: int) -> None:
        """Costs and acceptance at `context` rows, looked up again each CONTEXT_STEP rows
        (the costs move slowly with the context; `choose` asks before every step)."""
        step = context // CONTEXT_STEP
        if self.context is not None and step == self.context // CONTEXT_STEP:
            return
        self.context = context
        self.costs = self.by_context.at(context)
        self.acceptance = self._bands.at(context)
        # Interpolated once per context step: `choose` rates every block size before each step.
        self._cycle = {B: self.costs.cycle(B) for B in range(2, self.max_block + 1)}
        self._best: Optional[int] = None  # best_block(max_block), until the costs or the acceptance move

    # -- the model -----------------------------------------------------------------
    def plain_cost(self) -> float:
        return self.costs.plain * self.scale["plain"]

    def cycle_cost(self, B: int) -> float:
        return self._cycle[B] * self._spec_scale()

    def _spec_scale(self) -> float:
        # Far past the calibrated contexts a plain step and a cycle are extensions alike: until a
        # cycle is timed, it is taken to be off by what the plain step was, so the calibration's
        # ratio between them (not its absolute seconds) decides whether a first cycle runs.
        if self._extended() and not self._timed["spec"]:
            return self.scale["plain"]
        return self.scale["spec"]

    def rate(self, B: int) -> float:
        """Expected committed tokens per second at block size B (1: plain)."""
        if B <= 1:
            return 1.0 / self.plain_cost()
        return self.acceptance.expected_tokens(B) / self.cycle_cost(B)

    def best_block(self, tokens_left: int) -> int:
        """The speculative block size with the highest expected rate."""
        top = max(2, min(self.max_block, tokens_left + 1))
        if top == self.max_block and self._best is not None:
            return self._best
        # The learned scale multiplies every cycle alike, so it never changes which B is best:
        # only the context's costs and the acceptance do (both drop the cached answer).
        best = max(range(2, top + 1), key=lambda B: (self.rate(B), -B))
        if top == self.max_block:
            self._best = best
        return best

    def _can_ever_win(self) -> bool:
        # Even if every draft were accepted (B tokens per cycle) plain decoding is faster.
        return any(B / self.cycle_cost(B) > self.rate(1) for B in range(2, self.max_block + 1))

    # -- the loop's calls --------------------------------------------------------------
    def choose(self, tokens_left: int, context: Optional[int] = None) -> Decision:
        """The next cycle's block size (1: plain), and the state it leads to;
        `context`: the rows the target cache holds now (None: as last told)."""
        if context is not None:
            self.use_context(context)
        if tokens_left <= 1:
            return self._plain_step(self.mode, self.plain_left)
        if self.mode is Mode.RETIMING and self.plain_left > 0:
            return Decision(1, Mode.RETIMING, self.plain_left - 1)
        if self.mode in (Mode.WAITING, Mode.PLAIN_ONLY, Mode.PROBING):
            waiting = self.mode is Mode.PLAIN_ONLY or (self.mode is Mode.WAITING and self.plain_left > 0)
            # Without a clock and with the same context the costs never move, so this stays False
            # while waiting: what starts a probe early is measured costs or a longer context.
            if waiting and not (self._pays_by_margin(tokens_left) and self._new_evidence()):
                return self._plain_step(self.mode, self.plain_left)
            return Decision(self.best_block(tokens_left), Mode.PROBING)
        if self.clock is not None and self.mode is Mode.DRAFTING and (
                self._cycles_to_retime <= 0 or (not self._timed["plain"] and self._calibration_suspect())):
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
        self._best = None
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
            self._verdict = self._plain_vs_cycle()

    # -- internals --------------------------------------------------------------------
    def _retime_interval(self) -> int:
        """Cycles until the next re-timing, so that its plain steps cost at most
        `probe_budget` of the time drafting takes meanwhile."""
        B = self.best_block(self.max_block)
        lead = max(self.rate(B) / self.rate(1), 1.0)
        loss = RETIME_STEPS * self.plain_cost() * (1.0 - 1.0 / lead)
        cycles = math.ceil(loss / (self.probe_budget * self.cycle_cost(B)))
        return min(max(cycles, RETIME_FIRST), RETIME_MAX)

    def _extended(self) -> bool:
        """Whether the costs at this context are extended far past the calibrated ones."""
        return self._longest_measured is not None and self.context > EXTENDED * self._longest_measured

    def _calibration_suspect(self) -> bool:
        """Whether plain decoding must be timed now, not after RETIME_FIRST cycles: the costs are
        extended far past the calibrated contexts, or a timed cycle already found the table off
        by SUSPECT_RATIO (a calibration taken under load is off for plain steps too, by another
        factor: a busy machine's table said drafting paid where it lost)."""
        # The cycle that just ran counts already (it is charged when this decision is recorded).
        timing = self._timing(self.clock())
        spec = timing[1] if timing and timing[0] == "spec" and not self._timed["spec"] else self.scale["spec"]
        off = (self._timed["spec"] or timing) and not (1 / SUSPECT_RATIO < spec < SUSPECT_RATIO)
        return self._extended() or bool(off)

    def _new_evidence(self) -> bool:
        """Whether plain decoding's cost, relative to a cycle's, has moved by EARLY_PROBE_SHIFT
        since the last probe lost: only then may re-measured costs (or a context where drafting
        is cheaper) start a probe before its wait is over. (A busy spell slows the plain steps it times and the cycles it does not; without
        this each step of it would start another losing probe.)"""
        return self._verdict is None or self._plain_vs_cycle() > self._verdict * EARLY_PROBE_SHIFT

    def _plain_vs_cycle(self) -> float:
        """Plain decoding's cost relative to a cycle's, as the policy sees them now (learned
        scales and the context's costs both move it)."""
        return self.plain_cost() / self.cycle_cost(self.max_block)

    def _pays_by_margin(self, tokens_left: int) -> bool:
        return self.rate(self.best_block(tokens_left)) > self.rate(1) * (1.0 + self.margin)

    @staticmethod
    def _plain_step(mode: Mode, plain_left: int) -> Decision:
        """A plain step, one nearer to the next probe while waiting for one."""
        if mode is Mode.PROBING:  # a probe that was never observed: probe again
            mode = Mode.WAITING
        return Decision(1, mode, max(plain_left - 1, 0) if mode is Mode.WAITING else 0)

    def _timing(self, now: float) -> Optional[tuple[str, float]]:
        """The kind ("plain" or "spec") and measured / calibrated ratio of the previous decision,
        if the time since it says something."""
        last = self._last
        # The first plain step after a cycle is only launched, not waited for,
        # before the next decision: its interval says nothing.
        if last is None or not (last.block > 1 or last.previous == 1):
            return None
        predicted = self.costs.plain if last.block == 1 else self.costs.cycle(last.block)
        return ("plain" if last.block == 1 else "spec"), min(max((now - last.at) / predicted, 0.25), 4.0)

    def _tick(self, B: int) -> None:
        """Charge the time since the previous decision to that decision."""
        if self.clock is None:
            return
        now = self.clock()
        last = self._last
        timing = self._timing(now)
        if timing is not None:
            key, ratio = timing
            # This run's first timings replace the calibration, not average with it (a table
            # measured on a busy machine, or extended far past the calibrated contexts, can be
            # off by several times, and a 64-token answer cannot wait for a 0.1-weighted
            # average): the scale is the mean of this run's timings until there are
            # 1 / `cost_weight` of them, then a moving average by `cost_weight`.
            self._timed[key] += 1
            weight = max(RETIME_WEIGHT if last.retiming else self.cost_weight, 1.0 / self._timed[key])
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
