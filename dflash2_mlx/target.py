"""The target adapter: an mlx-lm model seen the way DFlash needs it.

It runs new tokens through the target with its cache and returns the logits of
every row plus the residual stream at the output of `layer_ids` (HF
`hidden_states[id + 1]`), concatenated. It does this by running each family's
own layer loop (the same calls, in the same order, as the model's `__call__`),
so no mlx-lm class is patched and the logits are bitwise those of `model(...)`.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from .errors import UnsupportedModelError


def _standard_layer_loop(inner: nn.Module, h: mx.array, cache: list, capture: set[int]):
    """Qwen3, Qwen2, Llama, Mistral, Qwen3-MoE: one mask from cache[0], plain layers."""
    mask = create_attention_mask(h, cache[0])
    captured = {}
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        h = layer(h, mask, c)
        if i in capture:
            captured[i] = h
    return inner.norm(h), captured


def _check_llama(model: nn.Module) -> None:
    if "sliding_attention" in (model.args.layer_types or []):
        raise UnsupportedModelError(
            f"target model_type '{model.model_type}' with sliding-window layers is not "
            "supported yet (its rotating cache cannot always roll back)"
        )


@dataclass(frozen=True)
class Family:
    layer_loop: Callable
    check: Optional[Callable[[nn.Module], None]] = None


# Attention-only families whose caches all trim exactly.
FAMILIES: dict[str, Family] = {
    "qwen3": Family(_standard_layer_loop),
    "qwen2": Family(_standard_layer_loop),
    "qwen3_moe": Family(_standard_layer_loop),
    "llama": Family(_standard_layer_loop, _check_llama),
    "mistral": Family(_standard_layer_loop, _check_llama),
}


def check_supported(model_type: str) -> None:
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"target model_type '{model_type}' is not supported; supported: "
            f"{', '.join(sorted(FAMILIES))}"
        )


class Target:
    """Wraps an mlx-lm `Model`; never changes its classes."""

    def __init__(self, model: nn.Module, layer_ids: Optional[list[int]] = None):
        model_type = getattr(model, "model_type", None) or model.args.model_type
        check_supported(model_type)
        family = FAMILIES[model_type]
        if family.check:
            family.check(model)
        inner = model.model
        if getattr(inner, "pipeline_size", 1) > 1:
            raise UnsupportedModelError("pipeline-sharded targets are not supported")
        self.model = model
        self.model_type = model_type
        self._inner = inner
        self._layer_loop = family.layer_loop
        self.layer_ids = list(layer_ids or [])

    # -- shapes ---------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self._inner.layers)

    @property
    def hidden_size(self) -> int:
        return self.model.args.hidden_size

    @property
    def embedding_rows(self) -> int:
        """Rows of the embedding table (valid token and mask ids)."""
        return self.model.args.vocab_size

    @property
    def vocab_size(self) -> int:
        """Width of the logits."""
        head = getattr(self.model, "lm_head", None)
        if head is not None and not self.model.args.tie_word_embeddings:
            return head.weight.shape[0]
        return self.embedding_rows

    @property
    def activation_dtype(self) -> mx.Dtype:
        return self._inner.norm.weight.dtype

    # -- pieces the drafter borrows --------------------------------------------
    def embed(self, tokens: mx.array) -> mx.array:
        return self._inner.embed_tokens(tokens)

    def lm_head(self, hidden: mx.array) -> mx.array:
        if self.model.args.tie_word_embeddings:
            return self._inner.embed_tokens.as_linear(hidden)
        return self.model.lm_head(hidden)

    def make_cache(self) -> list:
        return make_prompt_cache(self.model)

    # -- rollback -----------------------------------------------------------------
    def snapshot(self, cache: list):
        """State needed to undo the next forward (None: every cache trims exactly)."""
        return None

    def rollback(self, cache: list, snapshot, tokens: mx.array, keep: int) -> None:
        """Undo the last forward over `tokens` [1, L] except its first `keep` rows."""
        trim_prompt_cache(cache, tokens.shape[1] - keep)

    # -- forward ------------------------------------------------------------------
    def __call__(
        self, tokens: mx.array, cache: list, capture: bool = True, last_logits_only: bool = False
    ) -> tuple[mx.array, Optional[mx.array]]:
        """Run `tokens` [1, L] through the target, appending to `cache`.

        Returns logits [1, L, V] (or [1, 1, V] with `last_logits_only`) and the
        concatenated features [1, L, len(layer_ids)·Ht] when `capture`.
        """
        h = self.embed(tokens)
        wanted = set(self.layer_ids) if capture else set()
        h, captured = self._layer_loop(self._inner, h, cache, wanted)
        if last_logits_only:
            h = h[:, -1:]
        logits = self.lm_head(h)
        features = None
        if capture:
            features = mx.concatenate([captured[i] for i in self.layer_ids], axis=-1)
        return logits, features
