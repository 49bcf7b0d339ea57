"""Load a target split over MLX distributed ranks, the way its mlx-lm model
can be split: tensor parallel with its own `shard()` where it has one, else
pipeline parallel with its `pipeline()`. Families with neither are refused by
name.

Each rank reads the checkpoint lazily and keeps only its slices or layers (as
mlx-lm's `sharded_load` does); the drafter is small and loaded whole on every
rank.
"""

import mlx.core as mx

from ..engine.target.collectives import CollectiveClock, instrument
from ..engine.target.pipelined import PipelinedTarget
from ..engine.target.sharded import ShardedTarget
from ..engine.target.adapter import Target
from ..errors import UnsupportedModelError


def split_kind(model) -> str:
    """'tensor' or 'pipeline': how mlx-lm can split this (lazily built) model."""
    if hasattr(model, "shard"):
        return "tensor"
    if hasattr(getattr(model, "model", None), "pipeline"):
        return "pipeline"
    return ""


def check_shardable(model, model_type: str, ranks: int) -> None:
    """Refuse a (lazily built) target that `ranks` ranks cannot split, before
    any weight is read."""
    kind = split_kind(model)
    if not kind:
        raise UnsupportedModelError(
            f"target model_type '{model_type}' cannot be split over ranks: mlx-lm gives it no tensor or "
            "pipeline parallelism; run it in one process (drop --processes / --hostfile)"
        )
    args = model.args
    text = getattr(args, "text_config", None)
    dims = text if isinstance(text, dict) else vars(args)
    if kind == "pipeline":
        layers = dims.get("num_hidden_layers")
        if isinstance(layers, int) and layers < ranks:
            raise UnsupportedModelError(f"target has {layers} layers: too few for {ranks} pipeline ranks")
        return
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = dims.get(key)
        # qwen3_5 repeats key/value heads when there are fewer than ranks.
        if key == "num_key_value_heads" and model_type.startswith("qwen3_5") and value and ranks % value == 0:
            continue
        if isinstance(value, int) and value % ranks:
            raise UnsupportedModelError(
                f"target {key} {value} does not split over {ranks} ranks: use a rank count that divides it"
            )


def shard_target(model, model_type: str, group: mx.distributed.Group, time_collectives: bool = True) -> Target:
    """Split a lazily loaded mlx-lm `model` over `group` and wrap it."""
    check_shardable(model, model_type, group.size())
    clock = CollectiveClock(group.size(), timed=time_collectives)
    if split_kind(model) == "pipeline":
        return PipelinedTarget(model, group, clock)
    try:
        model.shard(group)
    except (ValueError, AssertionError) as e:
        raise UnsupportedModelError(
            f"target '{model_type}' does not split over {group.size()} ranks: {str(e).splitlines()[0]}"
        ) from None
    instrument(model, clock)
    return ShardedTarget(model, group, clock)


def barrier(group: mx.distributed.Group) -> None:
    """Every rank has finished loading (a slow loader would otherwise make the
    first collective of generation time out on the others)."""
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
