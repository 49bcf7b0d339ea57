"""The sliding-window rule, one definition for the target, the tree and the drafter.

A key at position k is in the window of a query at position q when
|q - k| < W. The target's sliding layers are causal as well (k <= q): the
window is the W positions q - W + 1 .. q (mlx-lm's rotating caches, the
target's `WindowKVCache`, the tree's per-node masks). The drafter's block is
non-causal: the published references (z-lab dflash `_attention_mask`, NeMo
Automodel `_sliding_window_mask` and its training mask) measure the window from
each query's own position with both bounds strict, so block row i of a block
anchored at p sees the context rows at p + i - W + 1 .. p - 1, i fewer than
row 0, and the block rows within W of itself (all of them when B <= W).
Giving every row the anchor's window is a different function from the one the
drafter was trained as; it departs once the context passes about W - B rows.

The rule works on MLX and numpy arrays alike (the tree builds its masks on the host).
"""

from typing import Optional

import mlx.core as mx


def in_window(distance, window: int, causal: bool):
    """Boolean: whether a key `distance` = q - k positions before its query is
    visible (|q - k| < window; with `causal`, also k <= q)."""
    visible = (distance < window) & (-distance < window)
    return visible & (distance >= 0) if causal else visible


def window_visible(query_pos, key_pos, window: int, causal: bool = False):
    """Boolean [..., Q, K]: which keys each query sees."""
    return in_window(query_pos[..., :, None] - key_pos[..., None, :], window, causal)


def decode_window_mask(context_rows: int, block_start: int, block: int, window: int) -> Optional[mx.array]:
    """Drafter mask [B, context_rows + B] for a block at `block_start` whose keys
    are the last `context_rows` context rows (positions block_start -
    context_rows .. block_start - 1) followed by the block itself.

    None when every key is visible to every row (the unmasked attention is then
    the same function, and stays the fast path).
    """
    if context_rows <= window - block and block <= window:
        return None
    q = mx.arange(block_start, block_start + block)
    k = mx.arange(block_start - context_rows, block_start + block)
    return window_visible(q, k, window)
