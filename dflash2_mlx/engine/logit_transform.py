"""The logit transform: an output multiplier, then an optional tanh softcap.

One idea with three holders: what a target's head applies after its
projection (Muse Glimmer: 0.196 and 20), what a DFlash 2 drafter declares its
selector was trained on, and what is left for the selector to apply to the
target's logits (`Pair.selector_transform`).
"""

import math
from typing import NamedTuple, Optional

import mlx.core as mx


class LogitTransform(NamedTuple):
    multiplier: float = 1.0
    softcap: Optional[float] = None

    @property
    def is_identity(self) -> bool:
        return _same(self.multiplier, 1.0) and self.softcap is None


IDENTITY = LogitTransform()


def apply_logit_transform(values: mx.array, transform: LogitTransform) -> mx.array:
    """`values * multiplier`, then `softcap * tanh(values / softcap)` when capped."""
    multiplier, softcap = transform
    if multiplier != 1.0:
        values = values * multiplier
    if softcap:
        values = softcap * mx.tanh(values / softcap)
    return values


def _same(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6)


def same_transform(a: LogitTransform, b: LogitTransform) -> bool:
    """Equal up to float rounding (configs spell 0.196 in different precisions)."""
    return _same(a.multiplier, b.multiplier) and _same(a.softcap, b.softcap)
