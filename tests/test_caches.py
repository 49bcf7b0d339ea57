"""`WindowKVCache`: sliding-window attention that can roll back after wrapping.

Random writes (single rows, blocks, prefill-length chunks) and trims are
checked against attention over the true history with the window applied.
"""

import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from dflash2_mlx.engine.target.caches import WindowKVCache

W, MAX_BLOCK, H, D = 6, 4, 2, 8


def attend(q, k, v, mask):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)


def reference(q, history_k, history_v, offset):
    """Each of the N queries at offset.. sees the history rows in its window."""
    N, T = q.shape[2], history_k.shape[2]
    pos = mx.arange(T)
    qpos = mx.arange(offset, offset + N)[:, None]
    mask = (pos[None] <= qpos) & (pos[None] > qpos - W)
    return attend(q, history_k, history_v, mask)


def test_random_writes_and_trims_match_full_history_attention():
    rng = np.random.RandomState(0)
    cache = WindowKVCache(W, MAX_BLOCK)
    hist_k = hist_v = None
    high = 0  # newest position ever written + 1: trims may go MAX_BLOCK + 1 behind it
    trims = 0
    for step in range(150):
        if step and rng.rand() < 0.35:  # roll back (part of) what was written since `high`
            n = int(rng.randint(0, MAX_BLOCK + 1 - (high - cache.offset) + 1))
            cache.trim(n)
            trims += n > 0
            hist_k, hist_v = hist_k[:, :, : cache.offset], hist_v[:, :, : cache.offset]
            continue
        N = int(rng.choice([1, 1, 2, 3, MAX_BLOCK, MAX_BLOCK + 1, 9, 23]))
        k, v, q = (mx.array(rng.randn(1, H, N, D).astype(np.float32)) for _ in range(3))
        offset = cache.offset
        mask = cache.make_mask(N, window_size=W)
        keys, values = cache.update_and_fetch(k, v)
        hist_k = k if hist_k is None else mx.concatenate([hist_k, k], axis=2)
        hist_v = v if hist_v is None else mx.concatenate([hist_v, v], axis=2)
        got = attend(q, keys, values, mask)
        want = reference(q, hist_k, hist_v, offset)
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5, rtol=1e-5)
        assert keys.shape[2] <= max(cache.capacity, W - 1 + N)
        high = max(high, cache.offset)
    assert cache.offset > 5 * cache.capacity and trims > 20


def test_trim_beyond_the_room_raises():
    cache = WindowKVCache(W, MAX_BLOCK)
    k = mx.zeros((1, H, 30, D))
    cache.update_and_fetch(k, k)
    cache.trim(MAX_BLOCK + 1)
    with pytest.raises(ValueError, match="cannot roll"):
        cache.trim(1)  # MAX_BLOCK + 2 rows behind the newest write in all


def test_mlx_rotating_cache_cannot_roll_back_once_wrapped():
    """Why WindowKVCache exists: the rotating cache stops being trimmable."""
    cache = RotatingKVCache(max_size=W)
    k = mx.zeros((1, H, 1, D))
    for _ in range(W):
        cache.update_and_fetch(k, k)
    assert not cache.is_trimmable()
    ring = WindowKVCache(W, MAX_BLOCK)
    for _ in range(3 * W):
        ring.update_and_fetch(k, k)
    assert ring.is_trimmable() and ring.trim(MAX_BLOCK) == MAX_BLOCK
