"""The sliding-window rule of drafter attention, for decode and training alike.

The published references (z-lab dflash `_attention_mask`, NeMo Automodel
`_sliding_window_mask` and its training mask) measure the window from each
query's own position: a block row at position q sees a key at position k iff
|q - k| < W (both bounds strict, non-causal). Block row i of a block anchored
at p therefore sees the context rows at p + i - W + 1 .. p - 1, i fewer than
row 0, and the block rows within W of itself (all of them when B <= W).
Giving every row the anchor's window is a different function from the one the
drafter was trained as; it departs once the context passes about W - B rows.
"""

from typing import Optional

import mlx.core as mx


def window_visible(query_pos: mx.array, key_pos: mx.array, window: int) -> mx.array:
    """Boolean [..., Q, K]: which keys each query sees (|q - k| < window)."""
    distance = query_pos[..., :, None] - key_pos[..., None, :]
    return (distance < window) & (-distance < window)


def decode_window_mask(context_rows: int, block_start: int, block: int, window: int) -> Optional[mx.array]:
    """Mask [B, context_rows + B] for a block at `block_start` whose keys are the
    last `context_rows` context rows (positions block_start - context_rows ..
    block_start - 1) followed by the block itself.

    None when every key is visible to every row (the unmasked attention is then
    the same function, and stays the fast path).
    """
    if context_rows <= window - block and block <= window:
        return None
    q = mx.arange(block_start, block_start + block)
    k = mx.arange(block_start - context_rows, block_start + block)
    return window_visible(q, k, window)
