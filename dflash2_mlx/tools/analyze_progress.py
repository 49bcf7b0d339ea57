"""How far `analyze` has got: what it reports to its `on_step` callback.

A run takes minutes (every variant, every prompt, twice or four times), so it
reports each unit of work as it starts; the caller decides how to show it.
"""

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class AnalyzeStep:
    """One unit of work about to start (`done` units finished of `total`);
    the last report has done == total and measurement "done"."""

    done: int
    total: int
    variant: str  # "dflash2", ...; "" for the final report
    measurement: str  # "teacher-forced recall", "decode at T=0", "cycle latency", ..., "done"
    detail: str = ""  # "sequences 9-16 of 40", "prompt 3 of 16", "round 2 of 5"

    @property
    def label(self) -> str:
        head = f"{self.variant}: {self.measurement}" if self.variant else self.measurement
        return f"{head}, {self.detail}" if self.detail else head


class StepCounter:
    """Numbers the units of work in the order they start; with no callback it
    only counts, so the measurements never branch on whether anyone watches."""

    def __init__(self, total: int, on_step: Optional[Callable[[AnalyzeStep], None]]):
        self.total, self.done, self._on_step = total, 0, on_step

    def start(self, variant: str, measurement: str, detail: str = "") -> None:
        if self._on_step is not None:
            self._on_step(AnalyzeStep(self.done, self.total, variant, measurement, detail))
        self.done += 1

    def ticker(self, variant: str, measurement: str) -> Callable[[str], None]:
        """`tick(detail)` for one measurement of one variant."""
        return lambda detail: self.start(variant, measurement, detail)

    def finish(self) -> None:
        # done, not total: a miscounted total shows as a last report short of (or past) it.
        if self._on_step is not None:
            self._on_step(AnalyzeStep(self.done, self.total, "", "done"))
