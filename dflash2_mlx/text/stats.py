"""Generation statistics, defined once and reported everywhere (τ and acceptance
by position as in docs/algorithm.md §5)."""

from dataclasses import asdict, dataclass
from typing import Optional

from ..engine.decode.loop import DecodeStep
from ..engine.target.sharded import split_parity
from .modes import MODE_LABELS, mode_name, short_mode_name  # noqa: F401  (re-exported)

@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    generation_tokens: int
    prompt_tps: float
    generation_tps: float  # tokens after the first / time after prefill
    target_passes: int  # target forward passes after prefill (verify passes, or AR steps)
    mean_acceptance_length: float  # τ: tokens committed per target pass after prefill
    acceptance_by_position: list[float]  # P(position t accepted | all earlier accepted)
    acceptance_histogram: list[int]  # cycles committing 1..B tokens
    drafted: int
    accepted: int
    peak_memory_gb: float
    backend: str
    mode: str  # "ar", "dflash" or "dflash2"
    block_size: int
    host_syncs_per_pass: Optional[float] = None
    # A target split over distributed ranks (1: one process). Collectives per
    # target pass after prefill, and the seconds spent in them per pass (None
    # when not timed, or when the family runs collectives that cannot be timed).
    ranks: int = 1
    collectives_per_pass: Optional[float] = None
    collective_s_per_pass: Optional[float] = None
    split_parity: Optional[str] = None  # with ranks: what the output promises against one process
    tree_rows: int = 0  # rows of each verify tree (0: the chain)
    verify_rows: int = 0  # rows the target ran after prefill, all passes together
    tau_per_verify_row: float = 0.0  # tokens committed per row the target ran
    # Speculative modes: "fixed" or "auto" (block size chosen per cycle), the
    # cycles run at each block size (1 = a plain decoding step), the share of
    # tokens after the first that plain steps decoded, and, when auto fell
    # back to plain decoding, when and why.
    block_policy: str = "fixed"
    block_sizes: Optional[dict[int, int]] = None
    plain_share: Optional[float] = None
    fallback: Optional[str] = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def collective_fields(clock, mark, dtype=None) -> dict:
    """`GenerationStats` fields for a split target's `CollectiveClock` since
    `mark` (taken after prefill), and (`dtype`: its activations') what its output
    promises; {} for a target in one process."""
    if clock is None or mark is None:
        return {}
    d = clock.mark() - mark
    timed = clock.timed and clock.complete and d.passes
    return dict(ranks=clock.ranks, collectives_per_pass=d.collectives / d.passes if d.passes else None,
                collective_s_per_pass=d.seconds / d.passes if timed else None,
                split_parity=split_parity(dtype) if dtype is not None else None)


class StatsRecorder:
    """Folds `DecodeStep`s (after the prefill step) into acceptance counters."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.passes = 0
        self.committed = 0
        self.drafted = 0
        self.accepted = 0
        self.verify_rows = 0
        self.histogram = [0] * block_size
        # reached[t]: cycles that drafted position t+1 with all earlier accepted.
        self.reached = [0] * max(block_size - 1, 0)
        self.hit = [0] * max(block_size - 1, 0)
        self.block_sizes: dict[int, int] = {}  # cycles per block size (1: plain steps)
        self.plain_tokens = 0

    def add(self, step: DecodeStep, kept: int) -> None:
        """`kept` is how many of the step's tokens were used (EOS/stop may cut)."""
        self.passes += 1
        self.committed += kept
        # Count what the cycle committed (EOS / a stop string may cut it), so the
        # histogram agrees with mean_acceptance_length.
        self.histogram[min(kept, self.block_size) - 1] += 1
        B = step.drafted + 1
        self.block_sizes[B] = self.block_sizes.get(B, 0) + 1
        if not step.drafted:
            self.plain_tokens += kept
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.verify_rows += step.verify_rows
        for t in range(min(step.accepted + 1, step.drafted)):
            self.reached[t] += 1
            if t < step.accepted:
                self.hit[t] += 1

    @property
    def mean_acceptance_length(self) -> float:
        return self.committed / self.passes if self.passes else 0.0

    @property
    def tau_per_verify_row(self) -> float:
        return self.committed / self.verify_rows if self.verify_rows else 0.0

    @property
    def plain_share(self) -> float:
        return self.plain_tokens / self.committed if self.committed else 0.0

    @property
    def by_position(self) -> list[float]:
        return [h / r if r else 0.0 for h, r in zip(self.hit, self.reached)]
