"""One target layer's caches for a batched pass: each sequence keeps its own.

A batched pass stacks the sequences' new rows as a batch, right-padded to
the longest (a sequence adds its anchor and drafted block, or one plain row).
Each layer's cache is replaced for that pass by a `BatchLayerView` over the
sequences' own caches (the ones a sequence alone would use: `KVCache`,
`WindowKVCache`):

- `offset` is the vector of the sequences' offsets (mlx-lm attention rotates
  with `rope(x, offset=cache.offset)`, which takes one offset per batch row);
- `update_and_fetch` writes only each sequence's valid rows into its own
  cache and hands the pass each sequence's keys, right-padded with zeros to
  the longest: a sequence's keys keep the columns they have alone;
- `make_mask` (what `create_attention_mask` asks) stacks each cache's own
  mask for its rows, padding columns and rows masked off (a padding row sees
  what the sequence's last row sees, so no row of the softmax is empty).

Rejected rows are therefore *removed*, never masked: after the pass each
sequence rolls its own cache back exactly as it would alone (trim, or the
sliding ring's room), so nothing a later pass reads depends on the batch it
ran in, and joining or leaving is adding or dropping a list entry. The cost is
one gather of the batch's keys per layer per pass (docs/batching.md); a run of
passes of one plain row each keeps its batch in one buffer instead (plain_run.py).
"""

from typing import Optional, Sequence

import mlx.core as mx

from ..kv_buckets import bucket


class BatchLayerView:
    """The caches of one layer for the sequences of a batched pass (see module doc).

    `members[i]` is a sequence's own cache, whose `lengths[i]` rows fill one batch
    row, or a tree's `TreeCacheView` (engine/tree/verify.py), whose nodes fill one
    batch row each (one row of their own, then padding): a tree is verified in the
    same pass as it would be alone, as a batch of its nodes."""

    def __init__(self, members: Sequence, lengths: Sequence[int]):
        self.members, self.lengths = list(members), list(lengths)
        self.rows = [_batch_rows(m) for m in self.members]

    @property
    def offset(self) -> mx.array:
        return mx.concatenate([m.offset.reshape(-1) if isinstance(m.offset, mx.array) else mx.array([m.offset])
                               for m in self.members])

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        ks, vs, at = [], [], 0
        for m, n, rows in zip(self.members, self.lengths, self.rows):
            k, v = m.update_and_fetch(keys[at : at + rows, :, :n], values[at : at + rows, :, :n])
            ks.append(k)
            vs.append(v)
            at += rows
        return stack_right_padded(ks), stack_right_padded(vs)

    def make_mask(self, N: int, return_array: bool = False, window_size: Optional[int] = None) -> mx.array:
        masks = [_own_mask(m, n, window_size) for m, n in zip(self.members, self.lengths)]  # [rows, n, keys]
        width = padded_width(max(m.shape[-1] for m in masks))
        out = []
        for m, n in zip(masks, self.lengths):
            m = mx.pad(m, [(0, 0), (0, 0), (0, width - m.shape[-1])], constant_values=False)
            if n < N:  # padding rows: the last real row's mask, so no softmax row is empty
                m = mx.concatenate([m, mx.broadcast_to(m[:, -1:], (m.shape[0], N - n, width))], axis=1)
            out.append(m)
        return mx.concatenate(out)[:, None]

    # A view is not a cache: callers that ask for these get them from the sequences' caches.
    def is_trimmable(self) -> bool:
        return False


def _batch_rows(member) -> int:
    """Batch rows a member fills: one per tree node (a vector of offsets), else one."""
    offset = member.offset
    return offset.size if isinstance(offset, mx.array) else 1


def _own_mask(member, n: int, window_size: Optional[int]) -> mx.array:
    """The boolean mask [batch rows, n, keys] `member` gives a pass of its own `n` rows."""
    mask = member.make_mask(n, return_array=True, window_size=window_size)
    if mask is None or isinstance(mask, str):  # a cache whose mask is implicit: every key, causal
        offset = member.offset
        mask = mx.arange(offset, offset + n)[:, None] >= mx.arange(offset + n)[None]
    mask = mask.astype(mx.bool_)
    return mask.reshape(-1, *mask.shape[-2:])  # a tree's [nodes, 1, 1, keys]: one row each


def padded_width(keys: int) -> int:
    """Key columns of a batched pass: whole buckets (engine/kv_buckets.py), so the
    shape of a batched attention changes once per bucket, not every cycle."""
    return bucket(keys)


def stack_right_padded(arrays: list, width: Optional[int] = None) -> mx.array:
    """[1, H, n_i, D] arrays -> [N, H, width, D] (default padded_width(max n_i)), zeros after
    each one's own rows."""
    width = width or padded_width(max(a.shape[2] for a in arrays))
    padded = [a if a.shape[2] == width else mx.pad(a, [(0, 0), (0, 0), (0, width - a.shape[2]), (0, 0)])
              for a in arrays]
    return mx.concatenate(padded, axis=0)
