"""Optional per-phase timing of decode cycles.

The decode loop calls `lap(phase, *arrays)` after each phase and `fetch` for
its one host synchronisation per cycle. The default profiler only counts
fetches; `CycleProfiler(timed=True)` evaluates each phase as it ends so its
time can be attributed (which adds syncs: use it to break a cycle down, not to
measure throughput).
"""

import time
from collections import defaultdict

import mlx.core as mx


class CycleProfiler:
    def __init__(self, timed: bool = False):
        self.timed = timed
        self.seconds: dict[str, float] = defaultdict(float)
        self.fetches = 0
        self._last = time.perf_counter()

    def start(self) -> None:
        """Mark the start of a phase sequence (a cycle)."""
        if self.timed:
            self._last = time.perf_counter()

    def lap(self, phase: str, *arrays) -> None:
        if not self.timed:
            return
        mx.eval(*arrays)
        now = time.perf_counter()
        self.seconds[phase] += now - self._last
        self._last = now

    def fetch(self, array: mx.array, phase: str = "accept") -> list:
        """Bring `array` to the host: the cycle's one synchronisation."""
        self.fetches += 1
        values = array.tolist()
        if self.timed:
            now = time.perf_counter()
            self.seconds[phase] += now - self._last
            self._last = now
        return values
