"""Stopping by held-out loss (`dflash2 train --patience N`).

A fixed step count either stops while the held-out loss still falls or trains on
past the point where it stopped improving. The trainer evaluates every
--eval-every steps; once the loss has not improved by MIN_IMPROVEMENT for N
evaluations in a row, it stops and exports the best evaluated weights.
"""

import math
from dataclasses import dataclass, field

MIN_IMPROVEMENT = 1e-3  # held-out loss (nats/token) that counts as better


@dataclass
class Plateau:
    evals: list = field(default_factory=list)  # (step, held-out loss), in order

    def add(self, step: int, loss: float) -> None:
        self.evals.append((step, loss))

    def state(self) -> tuple[int, float, int]:
        """(best step, best loss, evaluations since it)."""
        best_step, best_loss, since = 0, math.inf, 0
        for step, loss in self.evals:
            if loss < best_loss - MIN_IMPROVEMENT:
                best_step, best_loss, since = step, loss, 0
            else:
                since += 1
        return best_step, best_loss, since
