"""One drafter layer's context for a batched draft: each sequence keeps its own.

The drafting sequences' blocks `[anchor, MASK, ...]` run as one batch,
right-padded to the longest block; their pending context rows (features of
committed rows the drafter has not seen) come right-padded too. Each layer
sees a `BatchDraftContext` instead of `CachedContext`:

- each sequence's own rows enter its own cache, exactly as alone (so the
  cache never holds padding and needs nothing to leave the batch);
- each sequence's keys are its context then its block, as alone, right-padded
  with zeros to the longest, so its columns are the ones it has alone;
- the mask stacks each sequence's own mask (every key, or its sliding
  window), padding columns off; padding rows repeat the anchor row's.
"""

from typing import Optional, Sequence

import mlx.core as mx

from ..drafter.model import CachedContext
from .layer_view import padded_width, stack_right_padded


class BatchDraftContext:
    """The context of one drafter layer for a batch of drafting sequences."""

    def __init__(self, rows: Optional[mx.array], caches: Sequence, pending: Sequence[int], blocks: Sequence[int]):
        self.rows, self.caches = rows, list(caches)
        self.pending, self.blocks = list(pending), list(blocks)
        self._context: list = []

    def keys_values(self, attn, block: int):
        """(None, None, block starts [N], mask [N, 1, block, keys]); the context keys
        are kept here and joined to each block in `with_block`."""
        contexts, starts, masks = [], [], []
        for i, (c, p, b) in enumerate(zip(self.caches, self.pending, self.blocks)):
            rows = self.rows[i : i + 1, :p] if p else None
            kc, vc, start, mask = CachedContext(rows, c).keys_values(attn, b)
            contexts.append((kc, vc))
            starts.append(start)
            n = 0 if kc is None else kc.shape[2]
            masks.append(mx.ones((b, n + b), mx.bool_) if mask is None else mask.astype(mx.bool_))
        self._context = contexts
        width = padded_width(max(m.shape[1] for m in masks))
        return None, None, mx.array(starts), _stack_masks(masks, block, width)

    def with_block(self, kc, vc, kb: mx.array, vb: mx.array):
        keys, values = [], []
        for i, ((ck, cv), b) in enumerate(zip(self._context, self.blocks)):
            k, v = CachedContext.with_block(ck, cv, kb[i : i + 1, :, :b], vb[i : i + 1, :, :b])
            keys.append(k)
            values.append(v)
        return stack_right_padded(keys), stack_right_padded(values)


def _stack_masks(masks: list, rows: int, width: int) -> mx.array:
    out = []
    for m in masks:
        m = mx.pad(m, [(0, 0), (0, width - m.shape[1])], constant_values=False)
        if m.shape[0] < rows:
            m = mx.concatenate([m, mx.broadcast_to(m[:1], (rows - m.shape[0], width))], axis=0)
        out.append(m)
    return mx.stack(out)[:, None]
