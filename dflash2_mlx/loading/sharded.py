"""Load a target split over MLX distributed ranks, with the model's own `shard()`.

Each rank reads the checkpoint lazily and keeps only its slices (as mlx-lm's
`sharded_load` does); the drafter is small and loaded whole on every rank.
Families mlx-lm cannot split by tensor parallelism are refused by name.
"""

from typing import Optional

import mlx.core as mx

from ..engine.collectives import CollectiveClock, instrument
from ..engine.sharded import ShardedTarget
from ..errors import UnsupportedModelError


def check_shardable(model, model_type: str, ranks: int) -> None:
    """Refuse a (lazily loaded) target that `ranks` ranks cannot split, before
    any weight is read. The tests are mlx-lm's own (`sharded_load`)."""
    if not hasattr(model, "shard"):
        how = ("only pipeline parallelism, which dflash2 does not run yet"
               if hasattr(getattr(model, "model", None), "pipeline") else "no tensor or pipeline parallelism")
        raise UnsupportedModelError(
            f"target model_type '{model_type}' cannot be split over ranks: mlx-lm gives it {how}; "
            "run it in one process (drop --processes / --hostfile)"
        )
    args = model.args
    text = getattr(args, "text_config", None)
    dims = text if isinstance(text, dict) else vars(args)
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = dims.get(key)
        # qwen3_5 repeats key/value heads when there are fewer than ranks.
        if key == "num_key_value_heads" and model_type.startswith("qwen3_5") and value and ranks % value == 0:
            continue
        if isinstance(value, int) and value % ranks:
            raise UnsupportedModelError(
                f"target {key} {value} does not split over {ranks} ranks: use a rank count that divides it"
            )


def shard_target(model, model_type: str, group: mx.distributed.Group, time_collectives: bool = True) -> ShardedTarget:
    """Split a lazily loaded mlx-lm `model` over `group` and wrap it."""
    check_shardable(model, model_type, group.size())
    try:
        model.shard(group)
    except (ValueError, AssertionError) as e:
        raise UnsupportedModelError(
            f"target '{model_type}' does not split over {group.size()} ranks: {str(e).splitlines()[0]}"
        ) from None
    clock = CollectiveClock(group.size(), timed=time_collectives)
    instrument(model, clock)
    return ShardedTarget(model, group, clock)


def barrier(group: mx.distributed.Group) -> None:
    """Every rank has finished loading (a slow loader would otherwise make the
    first collective of generation time out on the others)."""
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))

