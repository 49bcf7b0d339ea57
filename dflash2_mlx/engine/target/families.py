"""Per-family pieces of the target adapter, and the one layer loop.

`run_layers` makes the same calls, in the same order, as each mlx-lm model's
own `__call__`, and also returns the residual stream at the output of the
`layer_ids` layers. Families differ in which mask each layer gets (the
`masks` choice), the embedding, the head's logit transform and how a
recurrent layer replays. The loop writes each recurrent layer's input rows
into `record` when asked, so the target can re-run those layers' mixers
after a rollback (see caches.py).
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask

from ...errors import UnsupportedModelError
from ..logit_transform import LogitTransform


def run_layers(family: "Family", inner: nn.Module, layers: list, h: mx.array, cache: list,
               layer_ids: set[int], record=None) -> tuple[mx.array, dict[int, mx.array]]:
    """The one layer loop: each layer with the mask its family gives it, the
    outputs of `layer_ids` captured, and (when `record` is given) the input
    rows of every recurrent layer written into it. Returns the last layer's
    output, not yet normed, and the captured outputs."""
    masks = family.masks(inner, layers, h, cache)
    captured = {}
    for i, (layer, c, mask) in enumerate(zip(layers, cache, masks)):
        if record is not None and getattr(layer, "is_linear", False):
            record[i] = h
        h = layer(h, mask, c)
        if i in layer_ids:
            captured[i] = h
    return h, captured


# -- the per-family mask choice: one mask per layer, made as the model's own `__call__` makes it


def _one_mask(inner, layers, h, cache) -> list:
    """Qwen3, Qwen2, Qwen3-MoE, Phi-3: one mask from cache[0] for every layer."""
    return [create_attention_mask(h, cache[0])] * len(layers)


def _llama_masks(inner, layers, h, cache) -> list:
    """`LlamaModel.__call__` (also Mistral): a full-attention mask and, when the
    model has sliding layers, a window mask from the first sliding layer's cache.
    Without sliding layers fa_idx is 0, so this is the one-mask choice exactly."""
    fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    swa_mask = None
    if inner.swa_idx is not None:
        swa_mask = create_attention_mask(h, cache[inner.swa_idx], window_size=inner.sliding_window)
    return [swa_mask if layer.use_sliding else fa_mask for layer in layers]


def _hybrid_masks(inner, layers, h, cache) -> list:
    """`Qwen3NextModel` / `Qwen3_5TextModel.__call__`: Gated DeltaNet layers get
    the ssm mask of the first recurrent cache, attention layers the causal mask
    of the first attention cache."""
    fa_mask = ssm_mask = None
    if inner.fa_idx is not None:
        fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    if inner.ssm_idx is not None:
        ssm_mask = create_ssm_mask(h, cache[inner.ssm_idx])
    return [ssm_mask if layer.is_linear else fa_mask for layer in layers]


def _replay_gated_deltanet(layer: nn.Module, h: mx.array, cache) -> None:
    """Advance one recurrent layer's state over rows `h` [1, L, Ht] (its inputs).

    The mixer half of the decoder layer's own `__call__`; its output is never
    evaluated, so MLX computes only what the new state needs.
    """
    layer.linear_attn(layer.input_layernorm(h), create_ssm_mask(h, cache), cache)


def _muse_glimmer_masks(inner, layers, h, cache) -> list:
    """`MuseGlimmerModel.__call__`: one mask per layer type from the first cache
    of that type; sliding layers get the window."""
    made, masks = {}, []
    for layer, c in zip(layers, cache):
        kind = layer.self_attn.layer_type
        if kind not in made:
            window = inner.window if kind == "sliding_attention" else None
            made[kind] = create_attention_mask(h, c, window_size=window)
        masks.append(made[kind])
    return masks


def _gemma3_masks(inner, layers, h, cache) -> list:
    """`Gemma3Model.__call__` (gemma3_text): the global mask from the first global
    layer's cache (index `sliding_window_pattern - 1`), the window mask from
    cache[0] when there are sliding layers; layer i is global when
    i % pattern == pattern - 1."""
    pattern = inner.sliding_window_pattern
    global_mask = create_attention_mask(h, cache[pattern - 1])
    window_mask = None
    if pattern > 1:
        window_mask = create_attention_mask(h, cache[0], window_size=inner.window_size)
    return [global_mask if i % pattern == pattern - 1 else window_mask for i in range(len(layers))]


def _muse_glimmer_embed(inner: nn.Module, tokens: mx.array) -> mx.array:
    # Scaleless RMSNorm on the embeddings, as the model's __call__ does: the
    # drafter's block rows must be exactly what the first target layer sees.
    return mx.fast.rms_norm(inner.embed_tokens(tokens), None, inner.embed_eps)


def _muse_glimmer_transform(args) -> LogitTransform:
    # `Model.__call__` after the head: output multiplier, then the softcap.
    return LogitTransform(args.output_multiplier, args.final_logit_softcapping)


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

    masks(inner, layers, h, cache) -> one attention mask per layer, as the
    model's own `__call__` makes them (the layer loop itself is `run_layers`).
    check(model) raises `UnsupportedModelError` for variants the loop does not follow.
    embed(inner, tokens) replaces a plain `embed_tokens` lookup.
    logit_transform(args) -> the `LogitTransform` the model applies after its LM
    head projection (None: the logits are the plain projection).
    replay(layer, h, cache) advances a recurrent layer over its input rows.
    """

    masks: Callable
    check: Optional[Callable[[nn.Module], None]] = None
    embed: Optional[Callable] = None
    logit_transform: Optional[Callable] = None
    replay: Optional[Callable] = None


_HYBRID = Family(_hybrid_masks, replay=_replay_gated_deltanet)

FAMILIES: dict[str, Family] = {
    "qwen3": Family(_one_mask),
    "qwen2": Family(_one_mask),
    "qwen3_moe": Family(_one_mask),
    "phi3": Family(_one_mask),
    "llama": Family(_llama_masks),
    "mistral": Family(_llama_masks),
    "qwen3_5": _HYBRID,
    "qwen3_5_moe": _HYBRID,
    "qwen3_next": _HYBRID,
    "muse_glimmer": Family(
        _muse_glimmer_masks, embed=_muse_glimmer_embed,
        logit_transform=_muse_glimmer_transform,
    ),
    "gemma3_text": Family(
        _gemma3_masks, check=_gemma3_check, embed=_gemma3_embed,
    ),
}
