"""Many training blocks per sequence in one drafter pass (the block of docs/algorithm.md §1).

Each block `[x_anchor, MASK, ...]` becomes one row of the batch; its queries
see the context rows strictly before its anchor and its own block, nothing
else (on sliding layers, each row only within its own window: engine/window.py).
The context keys/values of a sequence are projected once per layer and
gathered for each of its blocks.
"""

from typing import Optional

import mlx.core as mx
import numpy as np

from ..engine.window import window_visible
from ..engine.drafter.model import CachedContext


class PackedContext:
    """Context source for `DrafterAttention` during training."""

    def __init__(self, rows: mx.array, seq_of_block: mx.array, anchors: mx.array, block_size: int):
        self.rows = rows  # [S, L, H] projected target features
        self.seq_of_block = seq_of_block  # [NB] which sequence each block reads
        self.anchors = anchors  # [NB] absolute position of each anchor
        self.block_size = block_size

    def keys_values(self, attn, block: int):
        kc, vc = attn.keys_values(self.rows, 0)
        kc, vc = kc[self.seq_of_block], vc[self.seq_of_block]
        L = self.rows.shape[1]
        anchor = self.anchors[:, None]
        before_anchor = mx.arange(L)[None, :] < anchor  # [NB, L]
        if attn.sliding_window is None:
            block_keys = mx.ones((anchor.shape[0], block), dtype=mx.bool_)
            mask = mx.concatenate([before_anchor, block_keys], axis=1)[:, None, None, :]
            return kc, vc, self.anchors, mask
        # Each block row measures the window from its own position (window.py),
        # as the drafter was trained and as decode does.
        queries = anchor + mx.arange(block)[None, :]  # [NB, B]
        keys = mx.concatenate([mx.broadcast_to(mx.arange(L)[None, :], before_anchor.shape), queries], axis=1)
        in_window = window_visible(queries, keys, attn.sliding_window)  # [NB, B, L + B]
        own = mx.concatenate([before_anchor, mx.ones(queries.shape, dtype=mx.bool_)], axis=1)
        return kc, vc, self.anchors, (in_window & own[:, None, :])[:, None]

    with_block = staticmethod(CachedContext.with_block)  # each block after its sequence's context rows


def sample_anchors(keys: list, seq_len: int, block_size: int, per_seq: int, answers: Optional[np.ndarray] = None):
    """Random anchors with a full block ahead and at least one context row.

    One seed key per sequence (e.g. (seed, step, position in the global
    batch)), so a sequence gets the same anchors whichever process trains it.
    `answers` ([len(keys), seq_len] bool, data.Packed): when given, each block, its anchor
    and its labels, lies inside tokens the target writes, as every block does at inference
    (its anchor is a committed token of the answer); a sequence without such a block takes
    its anchors anywhere.
    """
    high = seq_len - block_size + 1  # exclusive: anchor + B - 1 <= L - 1
    if high <= 1:
        raise ValueError(f"block size {block_size} needs sequences longer than {block_size}")
    rows = []
    for i, k in enumerate(keys):
        rng = np.random.default_rng(k)
        inside = np.empty(0, dtype=np.int64)
        if answers is not None:
            written = np.concatenate([[0], np.cumsum(answers[i], dtype=np.int64)])
            whole = written[block_size:] - written[:-block_size] == block_size  # [a]: a .. a+B-1 all answer
            inside = np.flatnonzero(whole[1:high]) + 1
        rows.append(rng.choice(inside, size=per_seq) if inside.size else rng.integers(1, high, size=per_seq))
    anchors = np.stack(rows)
    seq = np.repeat(np.arange(len(keys)), per_seq)
    return seq.astype(np.int32), anchors.reshape(-1).astype(np.int32)


def make_blocks(tokens: mx.array, seq: mx.array, anchors: mx.array, block_size: int, mask_id: int):
    """Block inputs [NB, B] and labels [NB, B-1] (x_{anchor+k}, k = 1..B-1)."""
    offsets = mx.arange(block_size)[None, :]
    positions = anchors[:, None] + offsets
    window = tokens[seq[:, None], positions]
    inputs = mx.concatenate(
        [window[:, :1], mx.full((window.shape[0], block_size - 1), mask_id, dtype=window.dtype)], axis=1
    )
    return inputs, window[:, 1:]
