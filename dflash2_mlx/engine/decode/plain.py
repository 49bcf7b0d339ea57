"""Plain decoding: one token per target pass, written once.

`--ar`, the plain steps of `--block-size auto` and the calibration's plain
measurement all run `PlainStep`, with mlx-lm's look-ahead: the loop launches
the next step before it fetches the current token, so the device never waits
for Python. When the pair has a drafter, each step also captures the
drafter's target layers (references to activations the pass computes anyway),
so the rows decoded plainly reach the drafter cache before the next draft.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx

from ..pair import Pair
from ..target.adapter import Undo
from .profile import CycleProfiler
from .state import CycleOutcome, DecodeCache


@dataclass(frozen=True)
class PlainStep:
    """A launched one-token target pass whose token is not fetched yet."""

    token: mx.array  # the sampled next token (lazy)
    features: Optional[mx.array] = None  # [1, 1, F] of the row this pass ran (None: no drafter)
    undo: Optional[Undo] = None  # how to take the row back out of the target cache
    rows: int = 1  # target rows run; 0 for the prefill's first token

    @classmethod
    def launch(cls, pair: Pair, cache: DecodeCache, token: mx.array, sample: Callable, key) -> "PlainStep":
        """Run `token` through the target and start sampling what follows it."""
        logits, features, undo = pair.target.forward_undoable(token.reshape(1, 1), cache.target, pair.layer_ids)
        y = sample(logits[0, -1], key)
        mx.async_eval(y)
        return cls(y, features, undo)

    def finish(self, profiler: CycleProfiler) -> CycleOutcome:
        """Fetch the token: the step's one host sync (the prefill's is not a decode pass)."""
        token = profiler.fetch(self.token, "plain") if self.rows else self.token.item()
        return CycleOutcome((token,), verify_rows=self.rows, features=self.features)

    def cancel(self, pair: Pair, cache: DecodeCache) -> None:
        """Undo a look-ahead that will not be committed (the loop was closed)."""
        if self.undo is not None:
            pair.target.rollback(cache.target, self.undo, keep=0)
