"""A target split over ranks by layers (pipeline parallel), for families mlx-lm
can only split that way (its `pipeline()`: qwen3_next among ours).

mlx-lm's `pipeline()` gives the last layers to rank 0 and the first to rank
N-1; the stages run in that order and each stage's output reaches every rank
(`_forward` says how). Embeddings, the final norm and the head are on every
rank. What the drafter taps is the
problem: a layer's output exists only on the rank that runs it. Each rank puts
its own taps into a zero tensor of the full feature width and one all_sum
makes the whole features on every rank; adding zeros is exact, so they are
bitwise what one process computes.
"""

import mlx.core as mx
import mlx.nn as nn

from .collectives import CollectiveClock
from .adapter import DEFAULT_MAX_BLOCK, Target
from .families import run_layers


class PipelinedTarget(Target):
    """A `Target` whose layers are split over `group` with the model's own `pipeline()`."""

    def __init__(self, model: nn.Module, group: mx.distributed.Group, collectives: CollectiveClock,
                 max_block: int = DEFAULT_MAX_BLOCK):
        super().__init__(model, max_block=max_block)
        inner = self._inner
        self._total_layers = len(inner.layers)
        inner.pipeline(group)
        self.group = group
        self.collectives = collectives
        self._start = inner.start_idx
        # This rank's layers, indexed locally as its caches are (rollback too).
        self._layers = inner.pipeline_layers

    @property
    def num_layers(self) -> int:
        return self._total_layers

    def _forward(self, tokens, cache, layer_ids, last_logits_only, record):
        clock, group = self.collectives, self.group
        clock.begin_pass()
        r, n = self._inner.pipeline_rank, self._inner.pipeline_size
        ids = list(layer_ids)
        h = self.embed(tokens)
        captured = {}
        # Stage n-1 holds the first layers. After each stage an all_sum in
        # which only its owner contributes (x + 0 is exact) hands its output to
        # every rank. Unlike mlx-lm's send/recv (a recv has no inputs, so MLX
        # may schedule it before an earlier collective: a deadlock once a
        # look-ahead step is queued), every collective here takes the previous
        # one's output as input: one chain, the same order on every rank.
        for stage in reversed(range(n)):
            if stage == r:
                local = {i - self._start for i in ids if 0 <= i - self._start < len(self._layers)}
                h, captured = run_layers(self._family, self._inner, self._layers, h, cache, local, record)
            else:  # zeros that still wait for `h` (zeros_like alone has no inputs)
                h = mx.depends(mx.zeros_like(h), h)
            h = clock.run(lambda x: mx.distributed.all_sum(x, group=group), h)
        h = self._inner.norm(h)
        features = None
        if ids:
            zero = mx.zeros_like(h)
            mine = mx.concatenate([captured.get(i - self._start, zero) for i in ids], axis=-1)
            features = clock.run(lambda x: mx.distributed.all_sum(x, group=group), mx.depends(mine, h))
        if last_logits_only:
            h = h[:, -1:]
        return self.lm_head(h), features
