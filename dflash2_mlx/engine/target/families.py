"""Per-family pieces of the target adapter.

Each layer loop makes the same calls, in the same order, as its mlx-lm
model's own `__call__` (masks per layer kind, norms), and also returns the
residual stream at the output of the `layer_ids` layers. A loop that meets
recurrent layers writes each one's input rows into `record` when asked, so the
target can re-run those layers' mixers after a rollback (see caches.py).
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask

from ...errors import UnsupportedModelError
from ..logit_transform import LogitTransform


def _standard_layer_loop(inner: nn.Module, h: mx.array, cache: list, layer_ids: set[int], record=None):
    """Qwen3, Qwen2, Qwen3-MoE: one mask from cache[0], plain layers."""
    mask = create_attention_mask(h, cache[0])
    captured = {}
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        h = layer(h, mask, c)
        if i in layer_ids:
            captured[i] = h
    return inner.norm(h), captured


def _llama_layer_loop(inner: nn.Module, h: mx.array, cache: list, layer_ids: set[int], record=None):
    """`LlamaModel.__call__` (also Mistral): a full-attention mask and, when the
    model has sliding layers, a window mask from the first sliding layer's cache.
    Without sliding layers fa_idx is 0, so this is the standard loop exactly."""
    fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    swa_mask = None
    if inner.swa_idx is not None:
        swa_mask = create_attention_mask(h, cache[inner.swa_idx], window_size=inner.sliding_window)
    captured = {}
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        h = layer(h, swa_mask if layer.use_sliding else fa_mask, c)
        if i in layer_ids:
            captured[i] = h
    return inner.norm(h), captured


def _hybrid_layer_loop(inner: nn.Module, h: mx.array, cache: list, layer_ids: set[int], record=None):
    """`Qwen3NextModel` / `Qwen3_5TextModel.__call__`: Gated DeltaNet layers get
    the ssm mask of the first recurrent cache, attention layers the causal mask
    of the first attention cache."""
    fa_mask = ssm_mask = None
    if inner.fa_idx is not None:
        fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    if inner.ssm_idx is not None:
        ssm_mask = create_ssm_mask(h, cache[inner.ssm_idx])
    captured = {}
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        if record is not None and layer.is_linear:
            record[i] = h
        h = layer(h, mask=ssm_mask if layer.is_linear else fa_mask, cache=c)
        if i in layer_ids:
            captured[i] = h
    return inner.norm(h), captured


def _replay_gated_deltanet(layer: nn.Module, h: mx.array, cache) -> None:
    """Advance one recurrent layer's state over rows `h` [1, L, Ht] (its inputs).

    The mixer half of the decoder layer's own `__call__`; its output is never
    evaluated, so MLX computes only what the new state needs.
    """
    layer.linear_attn(layer.input_layernorm(h), create_ssm_mask(h, cache), cache)


def _muse_glimmer_layer_loop(inner: nn.Module, h: mx.array, cache: list, layer_ids: set[int], record=None):
    """`MuseGlimmerModel.__call__`: before any layer runs, one mask per layer
    type from the first cache of that type; sliding layers get the window."""
    made, masks = {}, []
    for layer, c in zip(inner.layers, cache):
        kind = layer.self_attn.layer_type
        if kind not in made:
            window = inner.window if kind == "sliding_attention" else None
            made[kind] = create_attention_mask(h, c, window_size=window)
        masks.append(made[kind])
    captured = {}
    for i, (layer, c, mask) in enumerate(zip(inner.layers, cache, masks)):
        h = layer(h, mask, c)
        if i in layer_ids:
            captured[i] = h
    return inner.norm(h), captured


def _muse_glimmer_embed(inner: nn.Module, tokens: mx.array) -> mx.array:
    # Scaleless RMSNorm on the embeddings, as the model's __call__ does: the
    # drafter's block rows must be exactly what the first target layer sees.
    return mx.fast.rms_norm(inner.embed_tokens(tokens), None, inner.embed_eps)


def _muse_glimmer_transform(args) -> LogitTransform:
    # `Model.__call__` after the head: output multiplier, then the softcap.
    return LogitTransform(args.output_multiplier, args.final_logit_softcapping)


def _gemma3_layer_loop(inner: nn.Module, h: mx.array, cache: list, layer_ids: set[int], record=None):
    """`Gemma3Model.__call__` (gemma3_text): the global mask from the first global
    layer's cache (index `sliding_window_pattern - 1`), the window mask from
    cache[0] when there are sliding layers; layer i is global when
    i % pattern == pattern - 1."""
    pattern = inner.sliding_window_pattern
    global_mask = create_attention_mask(h, cache[pattern - 1])
    sliding_window_mask = None
    if pattern > 1:
        sliding_window_mask = create_attention_mask(h, cache[0], window_size=inner.window_size)
    captured = {}
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        is_global = i % pattern == pattern - 1
        h = layer(h, global_mask if is_global else sliding_window_mask, c)
        if i in layer_ids:
            captured[i] = h
    return inner.norm(h), captured


def _gemma3_embed(inner: nn.Module, tokens: mx.array) -> mx.array:
    # The embedding scale exactly as the model's __call__ applies it: sqrt(hidden)
    # rounded to bfloat16 first, then cast to the activation dtype (so for hidden
    # 1152 it is 34.0, not 33.941...). The drafter's block rows must be exactly
    # what the first target layer sees.
    h = inner.embed_tokens(tokens)
    return h * mx.array(inner.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)


def _gemma3_check(model: nn.Module) -> None:
    args = getattr(model, "language_model", model).args
    # mlx-lm's gemma3_text applies no logit softcap (Gemma 3 has none); a version
    # whose args carry one runs a head this family does not copy.
    if getattr(args, "final_logit_softcapping", None) is not None:
        raise UnsupportedModelError(
            "gemma3_text target with final_logit_softcapping: this mlx-lm Gemma 3 head "
            "is not the one the adapter follows"
        )
    if args.sliding_window_pattern < 1 or args.num_hidden_layers < args.sliding_window_pattern:
        raise UnsupportedModelError(
            f"gemma3_text target with sliding_window_pattern {args.sliding_window_pattern} and "
            f"{args.num_hidden_layers} layers has no global layer to take its mask from"
        )


@dataclass(frozen=True)
class Family:
    """How to run one mlx-lm model family as a DFlash target.

    layer_loop(inner, h, cache, layer_ids, record) -> (normed h, {id: h})
    check(model) raises `UnsupportedModelError` for variants the loop does not follow.
    embed(inner, tokens) replaces a plain `embed_tokens` lookup.
    logit_transform(args) -> the `LogitTransform` the model applies after its LM
    head projection (None: the logits are the plain projection).
    replay(layer, h, cache) advances a recurrent layer over its input rows.
    """

    layer_loop: Callable
    check: Optional[Callable[[nn.Module], None]] = None
    embed: Optional[Callable] = None
    logit_transform: Optional[Callable] = None
    replay: Optional[Callable] = None


_HYBRID = Family(_hybrid_layer_loop, replay=_replay_gated_deltanet)

FAMILIES: dict[str, Family] = {
    "qwen3": Family(_standard_layer_loop),
    "qwen2": Family(_standard_layer_loop),
    "qwen3_moe": Family(_standard_layer_loop),
    "llama": Family(_llama_layer_loop),
    "mistral": Family(_llama_layer_loop),
    "qwen3_5": _HYBRID,
    "qwen3_5_moe": _HYBRID,
    "qwen3_next": _HYBRID,
    "muse_glimmer": Family(
        _muse_glimmer_layer_loop, embed=_muse_glimmer_embed,
        logit_transform=_muse_glimmer_transform,
    ),
    "gemma3_text": Family(
        _gemma3_layer_loop, check=_gemma3_check, embed=_gemma3_embed,
    ),
}
