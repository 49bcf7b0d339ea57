"""The DFlash / DFlash 2 drafter (docs/algorithm.md §1, §2).

A short stack of Qwen3 decoder layers with no embedding and no LM head of its
own. Target features, projected by `fc` and normed by `hidden_norm`, are
injected as extra keys/values into every layer; only committed context ever
enters the drafter's cache, so it never needs rollback. The block
`[anchor, MASK, ...]` attends non-causally to the cached context and itself.
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from .activations import gated
from .config import DrafterConfig
from .context_caches import ContextWindowCache, SinkWindowCache, check_draft_window
from .conv import TwoTapConv
from .selector import CandidateSelector
from ..kv_buckets import BucketedKVCache, bucket
from ..window import decode_window_mask


class DrafterAttention(nn.Module):
    def __init__(self, config: DrafterConfig, sliding_window: Optional[int]):
        super().__init__()
        H, hd = config.hidden_size, config.head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.scale = hd**-0.5
        self.sliding_window = sliding_window
        bias = config.attention_bias
        self.q_proj = nn.Linear(H, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(H, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(H, self.n_kv_heads * hd, bias=bias)
        # transformers' Qwen3 attention puts attention_bias on o_proj too.
        self.o_proj = nn.Linear(self.n_heads * hd, H, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
        self.rope = initialize_rope(
            hd,
            base=config.rope_theta,
            traditional=False,
            scaling_config=config.rope_scaling,
            max_position_embeddings=config.max_position_embeddings,
        )

    def keys_values(self, x: mx.array, offset: int):
        N, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(N, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(N, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return self.rope(k, offset=offset), v

    def __call__(self, x: mx.array, context: "CachedContext") -> mx.array:
        N, B, _ = x.shape
        kc, vc, block_start, mask = context.keys_values(self, B)
        q = self.q_norm(self.q_proj(x).reshape(N, B, self.n_heads, -1)).transpose(0, 2, 1, 3)
        q = self.rope(q, offset=block_start)
        kb, vb = context.with_block(kc, vc, *self.keys_values(x, block_start))
        # Non-causal: every block row sees the context rows and block rows its mask
        # allows (all of them on full-attention layers).
        out = mx.fast.scaled_dot_product_attention(q, kb, vb, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(N, B, -1))


class CachedContext:
    """Inference context for one layer: new committed rows enter the layer's
    cache, and the block sits right after everything cached."""

    def __init__(self, rows: Optional[mx.array], cache: KVCache):
        self.rows, self.cache = rows, cache

    def keys_values(self, attn: DrafterAttention, block: int):
        """(context keys, values, block start position, mask) for `attn` and a
        block of `block` rows."""
        cache = self.cache
        if self.rows is not None and self.rows.shape[1] > 0:
            kc, vc = cache.update_and_fetch(*attn.keys_values(self.rows, cache.offset))
        elif cache.offset > 0:
            kc, vc = cache.keys_and_values()
        else:
            kc = vc = None
        window = attn.sliding_window
        if window is None:
            if isinstance(cache, SinkWindowCache) and kc is not None:  # --draft-window N
                kc, vc, mask = _bucketed(kc, vc, None, block, cache.sink + cache.size)
                return kc, vc, cache.offset, mask
            if kc is None or not isinstance(cache, BucketedKVCache):
                return kc, vc, cache.offset, None
            # The context padded to its bucket, the padding masked: the block's key length
            # changes once per bucket, not every cycle (kv_buckets.py).
            kc, vc = cache.padded()
            context = mx.arange(bucket(cache.offset)) < cache.offset
            mask = mx.concatenate([mx.broadcast_to(context, (block, context.size)),
                                   mx.ones((block, block), mx.bool_)], axis=1)
            return kc, vc, cache.offset, mask
        if kc is None:
            return kc, vc, cache.offset, decode_window_mask(0, cache.offset, block, window)
        # Row 0 sees the last W - 1 context rows; the mask takes one more
        # from each later row (window.py).
        kc, vc = kc[:, :, -(window - 1) :], vc[:, :, -(window - 1) :]
        kc, vc, mask = _bucketed(kc, vc, decode_window_mask(kc.shape[2], cache.offset, block, window), block,
                                 window - 1)
        return kc, vc, cache.offset, mask

    @staticmethod
    def with_block(kc, vc, kb: mx.array, vb: mx.array):
        """The keys and values the block attends over: the context's, then its own."""
        if kc is None:
            return kb, vb
        return mx.concatenate([kc, kb], axis=2), mx.concatenate([vc, vb], axis=2)


class DrafterMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu"):
        super().__init__()
        self.hidden_act = hidden_act
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(gated(self.hidden_act, self.gate_proj(x), self.up_proj(x)))


class DrafterLayer(nn.Module):
    def __init__(self, config: DrafterConfig, layer_type: str):
        super().__init__()
        window = config.sliding_window if layer_type == "sliding_attention" else None
        H = config.hidden_size
        self.self_attn = DrafterAttention(config, window)
        self.mlp = DrafterMLP(H, config.intermediate_size, config.hidden_act)
        self.input_layernorm = nn.RMSNorm(H, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=config.rms_norm_eps)
        self.dflash2 = config.is_dflash2
        if self.dflash2:
            self.attention_conv = TwoTapConv(H, config.conv_group_size)
            self.mlp_conv = TwoTapConv(H, config.conv_group_size)

    def __call__(self, h: mx.array, context) -> mx.array:
        x = self.input_layernorm(h)
        if not self.dflash2:
            h = h + self.self_attn(x, context)
            return h + self.mlp(self.post_attention_layernorm(h))
        # Both sides use coefficients computed from the sublayer input (docs/algorithm.md §2).
        d = self.attention_conv.corrections(x)
        a = self.attention_conv(x, d, 0)
        a = self.self_attn(a, context)
        h = h + self.attention_conv(a, d, 1)
        m = self.post_attention_layernorm(h)
        e = self.mlp_conv.corrections(m)
        m = self.mlp(self.mlp_conv(m, e, 0))
        return h + self.mlp_conv(m, e, 1)


class Drafter(nn.Module):
    """DFlash (v1) or DFlash 2 drafter, by `config.architectures`."""

    def __init__(self, config: DrafterConfig, fc_in_features: Optional[int] = None):
        super().__init__()
        self.config = config
        # n_taps × target hidden size; loaders pass the width found in the file.
        n_taps = len(config.target_layer_ids or [0])
        in_width = fc_in_features or n_taps * config.hidden_size
        self.fc = nn.Linear(in_width, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = [DrafterLayer(config, kind) for kind in config.layer_types]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.is_dflash2:
            self.candidate_selector = CandidateSelector(
                config.hidden_size, config.vocab_size, config.selector_rank
            )

    @property
    def is_dflash2(self) -> bool:
        return self.config.is_dflash2

    @property
    def activation_dtype(self) -> mx.Dtype:
        # Norms are never quantized, so their dtype is the activation dtype.
        return self.norm.weight.dtype

    # `--draft-window N` (set_context_window): full-attention layers keep the sink
    # rows and the latest N context rows; None keeps the checkpoint's attention.
    context_window: Optional[int] = None

    def set_context_window(self, rows: Optional[int]) -> None:
        """Bound the context of full-attention layers to the first `SINK_ROWS`
        and the latest `rows` rows in caches made from now on (None: all rows).
        A speed and memory knob: the target still verifies every token, so the
        output does not change; sliding layers keep their trained window."""
        check_draft_window(rows)
        self.context_window = rows

    def make_cache(self) -> list:
        """One context cache per layer; sliding layers keep only their window,
        full-attention layers everything or, with a context window, its rows."""
        def full():
            return BucketedKVCache() if self.context_window is None else SinkWindowCache(self.context_window)

        return [
            ContextWindowCache(layer.self_attn.sliding_window - 1)
            if layer.self_attn.sliding_window is not None else full()
            for layer in self.layers
        ]

    def project_context(self, features: mx.array) -> mx.array:
        """Concatenated target features [N, P, n·Ht] -> context rows [N, P, H]."""
        return self.hidden_norm(self.fc(features))

    def __call__(
        self, block: mx.array, features: Optional[mx.array], cache: list[KVCache], context=CachedContext
    ) -> mx.array:
        """Run one block.

        block: embedded `[anchor, MASK, ...]` rows [N, B, H].
        features: target features of the pending committed rows [N, P, n·Ht]
            (P may be 0); they enter the cache before the block attends.
        Returns the final-normed hidden states of all B rows (row 0 is the anchor).
        `context(rows, layer cache)` makes each layer's view of its context
        (a batch of sequences passes its own: engine/batch/draft_view.py).
        """
        dtype = self.activation_dtype
        rows = None
        if features is not None and features.shape[1] > 0:
            rows = self.project_context(features.astype(dtype))
        h = block.astype(dtype)
        for layer, c in zip(self.layers, cache):
            h = layer(h, context(rows, c))
        return self.norm(h)

    def draft(self, block_ids: mx.array, features: Optional[mx.array], cache: list[KVCache], target):
        """Draft one block: (hidden [B-1, H], logits [B-1, V]) for rows 1..B-1.

        The block is embedded with the target's embedding and the rows are
        read out through the target's LM head (the drafter has neither).
        """
        hidden = self(target.embed(block_ids), features, cache)[0, 1:]
        hidden = hidden.astype(target.activation_dtype)
        return hidden, target.lm_head(hidden)

    def append_context(self, features: mx.array, cache: list[KVCache]) -> None:
        """Push committed context into the cache without drafting (chunked prefill)."""
        context = self.project_context(features.astype(self.activation_dtype))
        for layer, c in zip(self.layers, cache):
            attn = layer.self_attn
            k, v = attn.keys_values(context, c.offset)
            c.update_and_fetch(k, v)


def _bucketed(kc: mx.array, vc: mx.array, mask, block: int, most: int):
    """A window cache's context rows (at most `most` once it is full) while it fills:
    padded with zero rows to whole buckets (at most `most`), the padding masked off, so
    the block's key length changes once per bucket rather than every cycle, as a
    `BucketedKVCache`'s does (kv_buckets.py). `mask`: the block's mask over
    [context, block] (None: every key visible). Returns (keys, values, mask)."""
    rows = kc.shape[2]
    pad = min(bucket(rows), most) - rows
    if pad <= 0:
        return kc, vc, mask
    zeros = mx.zeros((*kc.shape[:2], pad, kc.shape[3]), kc.dtype)
    kc = mx.concatenate([kc, zeros], axis=2)
    vc = mx.concatenate([vc, mx.zeros((*vc.shape[:2], pad, vc.shape[3]), vc.dtype)], axis=2)
    if mask is None:
        mask = mx.ones((block, rows + block), mx.bool_)
    hidden = mx.zeros((block, pad), mx.bool_)
    return kc, vc, mx.concatenate([mask[:, :rows], hidden, mask[:, rows:]], axis=1)
