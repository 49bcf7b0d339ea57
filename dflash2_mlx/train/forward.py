"""Teacher-forced drafter passes over packed blocks (training and analysis)."""

import mlx.core as mx

from .packing import PackedContext


def target_features(target, tokens: mx.array, layer_ids: list[int]) -> mx.array:
    """Frozen target features at the drafter's layer ids for whole sequences."""
    _, feats = target(tokens, [None] * target.num_layers, layer_ids, last_logits_only=True)
    return mx.stop_gradient(feats)


def packed_forward(target, drafter, feats, inputs, seq, anchors):
    """(hidden [NB, B-1, H], logits [NB, B-1, V]) for packed blocks."""
    rows = drafter.project_context(feats.astype(drafter.activation_dtype))
    h = target.embed(inputs).astype(drafter.activation_dtype)
    ctx = PackedContext(rows, seq, anchors, inputs.shape[1])
    for layer in drafter.layers:
        h = layer(h, ctx)
    hidden = drafter.norm(h)[:, 1:].astype(target.activation_dtype)
    return hidden, target.lm_head(hidden)
