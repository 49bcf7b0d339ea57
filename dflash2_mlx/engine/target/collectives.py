"""Counting and timing the collectives of a tensor-parallel target.

mlx-lm's `shard()` ends every split projection in a `ShardedToAllLinear`
(attention `o_proj`, MLP `down_proj`) whose `all_sum` runs inside the layer.
`instrument` swaps those layer instances (no class is patched, as `shard()`
itself swaps them) for `TimedShardedToAll`, which does the same arithmetic
and tells a `CollectiveClock` about each all_sum. Counting is free. Timing
evaluates the graph before and after each all_sum, so the clock sees only the
collective (waiting for the slowest rank included); that costs two syncs per
collective on a GPU, so it is opt-in.
"""

import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import QuantizedShardedToAllLinear, ShardedToAllLinear


@dataclass(frozen=True)
class CollectiveTotals:
    passes: int = 0  # target forward passes
    collectives: int = 0  # collectives those passes ran
    seconds: float = 0.0  # time spent in them (0 when not timed)

    def __sub__(self, other: "CollectiveTotals") -> "CollectiveTotals":
        return CollectiveTotals(self.passes - other.passes, self.collectives - other.collectives,
                                self.seconds - other.seconds)


class CollectiveClock:
    """Totals over a run; `mark()` and subtraction give the totals of a stretch.

    `complete` is False when the model also runs collectives this module cannot
    see (written inline in mlx-lm's layers, e.g. Gated DeltaNet and MoE): its
    time is then a lower bound and is not reported.
    """

    def __init__(self, ranks: int, timed: bool = True, complete: bool = True):
        self.ranks = ranks
        self.timed = timed
        self.complete = complete
        self.passes = 0
        self.collectives = 0
        self.seconds = 0.0

    def begin_pass(self) -> None:
        self.passes += 1

    def run(self, fn, x: mx.array) -> mx.array:
        """`fn(x)` is one collective; time it when timing."""
        self.collectives += 1
        if not self.timed:
            return fn(x)
        mx.eval(x)
        tic = time.perf_counter()
        y = fn(x)
        mx.eval(y)
        self.seconds += time.perf_counter() - tic
        return y

    def mark(self) -> CollectiveTotals:
        return CollectiveTotals(self.passes, self.collectives, self.seconds)


class TimedShardedToAll(nn.Module):
    """A (quantized) `ShardedToAllLinear` whose all_sum goes through a clock;
    the same operations, in the same order, as the layer it wraps."""

    def __init__(self, layer: nn.Module, clock: CollectiveClock):
        super().__init__()
        self.layer = layer
        self._clock = clock  # underscore: not a child module or parameter

    def __call__(self, x: mx.array) -> mx.array:
        layer = self.layer
        if isinstance(layer, QuantizedShardedToAllLinear):
            x = mx.quantized_matmul(x, layer["weight"], scales=layer["scales"], biases=layer.get("biases"),
                                    transpose=True, group_size=layer.group_size, bits=layer.bits,
                                    mode=layer.mode)
        else:
            x = x @ layer["weight"].T
        x = self._clock.run(lambda v: mx.distributed.all_sum(v, group=layer.group), x)
        if "bias" in layer:
            x = x + layer["bias"]
        return x


def instrument(model: nn.Module, clock: CollectiveClock) -> int:
    """Route every sharded-to-all projection of `model` through `clock`;
    returns how many were wrapped. Marks the clock incomplete when some module
    carries its own `sharding_group` (collectives written inline)."""
    wrapped = 0
    for _, module in model.named_modules():
        if getattr(module, "sharding_group", None) is not None:
            clock.complete = False
        for key, child in list(module.items()):
            if isinstance(child, (ShardedToAllLinear, QuantizedShardedToAllLinear)):
                module[key] = TimedShardedToAll(child, clock)
                wrapped += 1
    return wrapped
