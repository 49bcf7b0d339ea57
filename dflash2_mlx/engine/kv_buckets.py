"""Attention whose shapes repeat: key lengths in buckets of `STEP` rows.

A verify pass (a few rows against the target's cache) and a draft (a block
against the drafter's context) attend over a cache that is a few rows longer
every cycle. MLX's CUDA backend sends a masked multi-row attention with
head_dim <= 128 to cuDNN, whose plans are cached by the exact key length and
mask shape (lablup/mlxcel#1799): a new length every cycle built new plans every
cycle, 40-75 ms against a 2.4-6.6 ms one-row step on an H200. So a multi-row
pass attends over the cache's buffer up to the next multiple of `STEP` (the
step mlx-lm's `KVCache` allocates in), the rows past the cache's offset masked
off: the shapes change once per `STEP` tokens, not once per cycle.

A masked key adds an exact zero to the softmax, so the output is the same
function; on the CPU backend it is bitwise the unpadded attention
(tests/test_attention_shapes.py). One-row steps keep the exact slice and no
mask: mlx-lm's own decode path, whose vector kernels do not plan per shape.
Prefill chunks of `STEP` rows or more keep mlx-lm's implicit causal mask.
"""

import mlx.core as mx
from mlx_lm.models.cache import KVCache

STEP = 256


def bucket(n: int) -> int:
    """`n` rounded up to a whole number of buckets."""
    return -(-n // STEP) * STEP


def padded_pass(rows: int) -> bool:
    """Whether a pass of `rows` new rows attends over the padded buffer."""
    return 1 < rows < STEP


def causal_bucket_mask(offset: int, rows: int, window_size=None) -> mx.array:
    """Boolean [rows, bucket(offset + rows)]: row i (position offset + i) sees keys
    0..offset + i (within `window_size` when given); the padding is never seen."""
    q = mx.arange(offset, offset + rows)[:, None]
    k = mx.arange(bucket(offset + rows))[None]
    mask = q >= k
    if window_size is not None:
        mask = mask & (q < k + window_size)
    return mask


class BucketedKVCache(KVCache):
    """mlx-lm's `KVCache` whose buffer always holds whole buckets, and whose
    multi-row passes see all of the bucket (see the module doc). Trimming,
    state and every other behaviour are `KVCache`'s."""

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev, L = self.offset, keys.shape[2]
        self._reserve(prev + L, keys, values)
        self.offset += L
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        if padded_pass(L):
            return self.padded()
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def padded(self) -> tuple[mx.array, mx.array]:
        """Keys and values up to the bucket's end: rows past `offset` are stale or zero."""
        if self.keys is None:
            return None, None
        self._reserve(self.offset, self.keys, self.values)
        end = bucket(self.offset)
        return self.keys[..., :end, :], self.values[..., :end, :]

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        if padded_pass(N):
            return causal_bucket_mask(self.offset, N, window_size)
        return super().make_mask(N, return_array=return_array, window_size=window_size)

    def _reserve(self, rows: int, keys: mx.array, values: mx.array) -> None:
        """Grow the buffer to hold `rows` rows in whole buckets (a restored prompt
        cache's buffer may end anywhere: it grows from where it ends)."""
        have = 0 if self.keys is None else self.keys.shape[2]
        if bucket(rows) > have:
            grow_buffers(self, bucket(rows), keys, values)


def grow_buffers(cache, size: int, keys: mx.array, values: mx.array) -> None:
    """Extend `cache.keys` / `cache.values` with zero rows to `size` rows, shaped and
    typed like the new `keys` / `values` (the first write creates them)."""
    have = 0 if cache.keys is None else cache.keys.shape[2]
    B, H, _, Dk = keys.shape
    more_k = mx.zeros((B, H, size - have, Dk), keys.dtype)
    more_v = mx.zeros((B, H, size - have, values.shape[3]), values.dtype)
    if cache.keys is None:
        cache.keys, cache.values = more_k, more_v
    else:
        cache.keys = mx.concatenate([cache.keys, more_k], axis=2)
        cache.values = mx.concatenate([cache.values, more_v], axis=2)
