"""The target adapter: an mlx-lm model seen the way DFlash needs it.

It runs new tokens through the target with its cache and returns the logits of
every row plus the residual stream at the output of the layer ids it is given
(HF `hidden_states[id + 1]`), concatenated. It does this by running each family's
own layer loop (the same calls, in the same order, as the model's `__call__`),
so no mlx-lm class is patched and the logits are bitwise those of `model(...)`.
Per-family loops live in families.py; caches that cannot simply trim
(sliding-window, recurrent) are replaced or snapshotted (caches.py,
docs/rollback.md) so every verify forward can be undone exactly.
"""

from dataclasses import dataclass
from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache, KVCache, RotatingKVCache, can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache,
)

from .caches import RecurrentCache, RecurrentSnapshot, WindowKVCache
from ...errors import UnsupportedModelError
from .families import FAMILIES, Family, run_layers  # noqa: F401  (Family: re-exported for callers)
from ..kv_buckets import BucketedKVCache
from ..logit_transform import IDENTITY, LogitTransform, apply_logit_transform

# Rows a verify block may roll back by default: the largest released DFlash
# block size (16). Sliding-window caches keep this many rows beyond the window.
DEFAULT_MAX_BLOCK = 16


@dataclass(frozen=True)
class Undo:
    """What `Target.rollback` needs to undo one `forward_undoable` call: its
    input rows and, for recurrent layers, their state before it (None when
    every cache trims exactly)."""

    tokens: mx.array  # [1, L]
    snapshot: Optional[RecurrentSnapshot]

    def kept(self, rows: int) -> "Undo":
        """The record of a forward over only the first `rows` rows: what a
        cache rolled back to keep `rows` can be undone (further) with."""
        snapshot = None if self.snapshot is None else self.snapshot.first(rows)
        return Undo(self.tokens[:, :rows], snapshot)


def check_supported(model_type: str) -> None:
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"target model_type '{model_type}' is not supported; supported: "
            f"{', '.join(sorted(FAMILIES))}"
        )


class Target:
    """Wraps an mlx-lm `Model`; never changes its classes.

    `max_block` is the longest verify block the caches must be able to undo
    (sliding-window caches keep that many rows beyond their window).
    """

    def __init__(self, model: nn.Module, max_block: int = DEFAULT_MAX_BLOCK):
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
        self.max_block = max_block
        # Multimodal wrappers (qwen3_5) keep the head and text config one level down.
        self._text = getattr(model, "language_model", model)
        self._inner = inner
        self._family = family
        # The layers this process runs; cache i belongs to layer i (a pipelined
        # target runs a slice of them).
        self._layers = inner.layers

    # -- shapes ---------------------------------------------------------------
    @property
    def args(self):
        """The text model's mlx-lm `ModelArgs`."""
        return self._text.args

    @property
    def num_layers(self) -> int:
        return len(self._inner.layers)

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    @property
    def embedding_rows(self) -> int:
        """Rows of the embedding table (valid token and mask ids)."""
        return self.args.vocab_size

    @property
    def vocab_size(self) -> int:
        """Width of the logits."""
        head = getattr(self._text, "lm_head", None)
        if head is not None and not self.tied_embeddings:
            return head.weight.shape[0]
        return self.embedding_rows

    @property
    def tied_embeddings(self) -> bool:
        """Whether the head is the embedding table. gemma3_text decides this on the
        model (its `sanitize` sets `tie_word_embeddings` from the weights; its args
        have no such field), the other families in their args."""
        tied = getattr(self._text, "tie_word_embeddings", None)
        return tied if isinstance(tied, bool) else self.args.tie_word_embeddings

    @property
    def activation_dtype(self) -> mx.Dtype:
        return self._inner.norm.weight.dtype

    @property
    def logit_transform(self) -> LogitTransform:
        """What `lm_head` applies after the projection; the identity for families
        whose logits are the plain head projection."""
        if self._family.logit_transform is None:
            return IDENTITY
        return self._family.logit_transform(self.args)

    @property
    def has_window_layers(self) -> bool:
        """Whether some layers are sliding-window (rollback limited to `max_block`)."""
        return any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(self.model))

    # -- pieces the drafter borrows --------------------------------------------
    def embed(self, tokens: mx.array) -> mx.array:
        """Exactly what the target feeds its first layer (Muse Glimmer norms it,
        Gemma 3 scales it by sqrt(hidden_size) rounded to bfloat16)."""
        if self._family.embed is not None:
            return self._family.embed(self._inner, tokens)
        return self._inner.embed_tokens(tokens)

    def lm_head(self, hidden: mx.array) -> mx.array:
        """Final-normed hidden -> exactly the target's logits, including any
        output multiplier and softcap the model applies after its head.

        DFlash 2 note: a drafter config may declare `output_multiplier` and
        `final_logit_softcapping` (the released Muse Glimmer drafter declares the
        target's own 0.196 and 20). In the reference they are applied once, to
        the raw head projection. Since these logits already include them, the
        selector's unary must take the top-K of these logits unchanged: applying
        the declared values again would square the multiplier and cap twice
        (`pair.selector_transform` says what is left to apply).
        """
        if self.tied_embeddings:
            out = self._inner.embed_tokens.as_linear(hidden)
        else:
            out = self._text.lm_head(hidden)
        transform = self.logit_transform
        return out if transform.is_identity else apply_logit_transform(out, transform)

    def make_cache(self) -> list:
        """The model's own cache, with layers that cannot roll back replaced:
        sliding-window layers by `WindowKVCache`, recurrent ones by `RecurrentCache`;
        full-attention layers by `BucketedKVCache`, so verify passes repeat their
        shapes (kv_buckets.py)."""
        return [self._rollback_cache(c) for c in make_prompt_cache(self.model)]

    def _rollback_cache(self, c):
        if isinstance(c, RotatingKVCache):
            if c.keep:
                raise UnsupportedModelError(
                    f"target '{self.model_type}' keeps {c.keep} attention-sink rows in its "
                    "rotating cache; that cache cannot roll back and is not supported"
                )
            return WindowKVCache(c.max_size, self.max_block)
        if type(c) is ArraysCache:
            return RecurrentCache(len(c.cache))
        if type(c) is KVCache:
            return BucketedKVCache()
        return c

    # -- forward and rollback ---------------------------------------------------
    def __call__(
        self, tokens: mx.array, cache: list, layer_ids: Sequence[int] = (), last_logits_only: bool = False
    ) -> tuple[mx.array, Optional[mx.array]]:
        """Run `tokens` [1, L] through the target, appending to `cache`.

        Returns logits [1, L, V] (or [1, 1, V] with `last_logits_only`) and the
        outputs of `layer_ids` concatenated, [1, L, len(ids)·Ht] (None when no
        ids are given).
        """
        return self._forward(tokens, cache, layer_ids, last_logits_only, None)

    def forward_undoable(
        self, tokens: mx.array, cache: list, layer_ids: Sequence[int] = ()
    ) -> tuple[mx.array, Optional[mx.array], Undo]:
        """`__call__` that also returns what `rollback` needs to undo it.

        For recurrent layers that is their state arrays before the forward and
        the rows that enter them during it (so `rollback` can re-run their
        mixers over the accepted rows); attention caches just trim.
        """
        states = {i: (list(c.cache), getattr(c, "offset", 0))
                  for i, c in enumerate(cache) if isinstance(c, ArraysCache)}
        snapshot = RecurrentSnapshot(states) if states else None
        record = snapshot.inputs if snapshot is not None else None
        logits, features = self._forward(tokens, cache, layer_ids, False, record)
        return logits, features, Undo(tokens, snapshot)

    def rollback(self, cache: list, undo: Undo, keep: int) -> None:
        """Undo the forward `undo` came from, except its first `keep` rows."""
        n = undo.tokens.shape[1] - keep
        snapshot = undo.snapshot
        if snapshot is None:
            if not can_trim_prompt_cache(cache):
                raise ValueError("this target cache cannot roll back: make it with Target.make_cache()")
            trim_prompt_cache(cache, n)
            return
        for i, c in enumerate(cache):
            if i not in snapshot.states:
                c.trim(n)
            elif n > 0:
                arrays, offset = snapshot.states[i]
                c.cache = list(arrays)
                c.offset = offset
                if keep > 0:
                    self._family.replay(self._layers[i], snapshot.inputs[i][:, :keep], c)

    def _forward(self, tokens, cache, layer_ids, last_logits_only, record):
        ids = list(layer_ids)
        h = self.embed(tokens)
        h, captured = run_layers(self._family, self._inner, self._layers, h, cache, set(ids), record)
        h = self._inner.norm(h)
        if last_logits_only:
            h = h[:, -1:]
        logits = self.lm_head(h)
        features = mx.concatenate([captured[i] for i in ids], axis=-1) if ids else None
        return logits, features
