"""A target split over MLX distributed ranks (tensor parallel).

What the DFlash loop needs from a sharded target is exactly what it needs from
a whole one, because of where mlx-lm's `shard()` puts the collectives: every
decoder layer ends its split attention and MLP in a sharded-to-all projection
whose all_sum runs inside the layer, before the residual add. The residual
stream at a layer boundary, which is what the drafter taps, is therefore the
whole vector and the same on every rank; embeddings and the final norm are
replicated. The one piece left split is a head sharded by vocabulary rows
(qwen3_5 does that): `lm_head` gathers it, so every rank holds all logits and
makes the same accept/sample decisions from the same seed.
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import gather_last_axis

from .collectives import CollectiveClock
from .adapter import DEFAULT_MAX_BLOCK, Target

# Each rank rounds its partial sum of a sharded-to-all projection to the activation dtype
# before the all_sum. In float32 that rounding is far below any logit gap the tests meet;
# in bfloat16 (the dtype real checkpoints ship in) it moves logits by up to this share of
# their largest magnitude (2.0 % measured on a 4-layer look-alike:
# benchmarks/results/sharded-bf16-cpu.json), so a near-tie can flip a token.
BF16_SPLIT_BOUND = 0.05


def split_parity(dtype: mx.Dtype) -> str:
    """What a target of `dtype` split over ranks promises against one process."""
    if dtype == mx.float32:
        return "float32 target: token-identical to one process"
    return (f"{str(dtype).split('.')[-1]} target: equal to one process up to the rounding of the ranks' split sums "
            f"(logits within {BF16_SPLIT_BOUND:.0%} of their scale; a near-tie may pick another token)")


class ShardedTarget(Target):
    """A `Target` whose model was split with its own `shard(group)`.

    `collectives` counts (and, when asked, times) the all_sums of each pass.
    """

    def __init__(self, model: nn.Module, group: mx.distributed.Group, collectives: CollectiveClock,
                 max_block: int = DEFAULT_MAX_BLOCK):
        super().__init__(model, max_block=max_block)
        self.group = group
        self.collectives = collectives
        self._head_group: Optional[mx.distributed.Group] = getattr(self._text, "sharding_group", None)

    @property
    def vocab_size(self) -> int:
        if self._head_group is not None and not self.tied_embeddings:
            return self._text.lm_head.weight.shape[0] * self._head_group.size()
        return super().vocab_size

    def lm_head(self, hidden: mx.array) -> mx.array:
        if self._head_group is None or self.tied_embeddings:
            return super().lm_head(hidden)
        out = self.collectives.run(lambda x: gather_last_axis(x, self._head_group), self._text.lm_head(hidden))
        transform = self.logit_transform
        return out if transform.is_identity else self._apply(out, transform)

    def _forward(self, tokens, cache, layer_ids, last_logits_only, record):
        self.collectives.begin_pass()
        return super()._forward(tokens, cache, layer_ids, last_logits_only, record)

    @staticmethod
    def _apply(out, transform):
        from ..logit_transform import apply_logit_transform

        return apply_logit_transform(out, transform)
