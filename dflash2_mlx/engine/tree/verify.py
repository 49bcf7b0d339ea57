"""One target pass over a draft tree, exact (docs/tree.md).

mlx-lm attention rotates queries and keys with `rope(x, offset=cache.offset)`
and `mx.fast.rope` accepts one offset per *batch* row, not per sequence row.
So the tree's N nodes run as a batch of N one-token sequences through the
family's layer loop (`run_layers` with its masks), and each target cache is replaced for that pass by
a `TreeCacheView`:

- its `offset` is the vector of node positions (context length + depth);
- `update_and_fetch` keeps the nodes' new rows and hands each node the keys
  the sequential run along its path would see: the context as stored, then
  its ancestors and itself in depth order (for a sliding-window ring: the
  ring with the path written into its slots);
- `make_mask` (what `create_attention_mask` asks) returns each node's mask.

Each node therefore computes bitwise what stepping its path one token at a
time computes (CPU backend; tests/test_tree_parity.py). Nothing is written
into the target caches during the pass: `commit` writes the accepted path's
rows into place afterwards, so rejected branches never need rolling back.
"""

from typing import Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache

from ..kv_buckets import BucketedKVCache, bucket
from ..target.caches import WindowKVCache
from ..window import in_window
from ..decode.verify import residual
from ..sampling import greedy_token
from .build import DraftTree


def branch_blocker(cache: list) -> Optional[str]:
    """Why a tree cannot be verified in one pass over these caches, or None."""
    for c in cache:
        if isinstance(c, ArraysCache):
            return "has recurrent (Gated DeltaNet) layers, whose state cannot branch in one pass"
        if type(c) not in (KVCache, BucketedKVCache, WindowKVCache):
            return f"uses a {type(c).__name__} cache, which tree verification does not know"
    return None


def _paths(tree: DraftTree) -> np.ndarray:
    """[N, D] node ids of each node's path (root first), padded with -1."""
    D = tree.max_depth + 1
    out = np.full((tree.rows, D), -1, np.int64)
    for j in range(tree.rows):
        p = tree.path(j)
        out[j, : len(p)] = p
    return out


class _Layout:
    """Per-node gather indices into `context rows ++ node rows` and masks,
    shared by every layer whose cache has the same geometry."""

    def __init__(self, cache, tree: DraftTree, paths: np.ndarray):
        P = cache.offset
        depth = np.asarray(tree.depth)
        N, D = paths.shape
        if isinstance(cache, WindowKVCache):
            # The ring as stepping the path would leave it: slot s holds the newest
            # position <= the node's that is congruent to s (WindowKVCache.key_positions);
            # positions from P on are the path's rows, older ones the stored ring's.
            cap, window = cache.capacity, cache.window
            self.context = 0 if cache.keys is None else cache.keys.shape[2]
            K = min(P + D, cap)
            end = P + depth[:, None] + 1  # [N, 1]: one past each node's position
            s = np.arange(K)[None, :]
            pos = s + cap * ((end - 1 - s) // cap)  # what slot s holds after the path
            on_path = pos >= P
            step = np.clip(pos - P, 0, D - 1)
            idx = np.where(on_path, self.context + np.take_along_axis(paths, step, axis=1), s)
            q = end - 1
            mask = (s < np.minimum(end, cap)) & in_window(q - pos, window, causal=True)
            self.window = window
        else:
            # Context rows 0..P-1 as stored, then the path in depth order, padding masked. The
            # context takes its whole bucket (kv_buckets.py), so the key length of a tree
            # pass changes once per bucket, not every cycle.
            self.context = P
            width = bucket(P) if isinstance(cache, BucketedKVCache) else P
            path_idx = np.where(paths >= 0, P + paths, 0)
            idx = np.concatenate([np.broadcast_to(np.arange(width), (N, width)), path_idx], axis=1)
            mask = np.concatenate([np.broadcast_to(np.arange(width) < P, (N, width)), paths >= 0], axis=1)
            self.window = None
        self.index = mx.array(np.where(mask, idx, 0).astype(np.int32))
        self.mask = mx.array(mask)[:, None, None, :]


class TreeCacheView:
    """Stands in for one target cache during a tree pass (see module doc)."""

    def __init__(self, cache, offsets: mx.array, layout: _Layout):
        self.cache = cache
        self.offset = offsets
        self.layout = layout
        self.keys = self.values = None  # the nodes' rows [N, Hkv, 1, D], after the pass

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        # The layout already applies the cache's own window; a family asking for
        # another one would need its own layout.
        if window_size is not None and window_size != self.layout.window:
            raise ValueError(f"tree mask for window {window_size} over a cache with window {self.layout.window}")
        return self.layout.mask

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self.keys, self.values = keys, values
        return self._gather(keys), self._gather(values, values=True)

    def _gather(self, rows: mx.array, values: bool = False) -> mx.array:
        new = rows[:, :, 0, :].transpose(1, 0, 2)  # [Hkv, N, D]
        n_ctx = self.layout.context
        if n_ctx:
            stored = self.cache.values if values else self.cache.keys
            new = mx.concatenate([stored[0, :, :n_ctx, :], new], axis=1)
        return new[:, self.layout.index].transpose(1, 0, 2, 3)  # [N, Hkv, K, D]


def tree_views(cache: list, tree: DraftTree) -> list[TreeCacheView]:
    paths = _paths(tree)
    layouts: dict = {}
    views = []
    for c in cache:
        geometry = (type(c), c.offset, getattr(c, "capacity", None), getattr(c, "window", None),
                    None if c.keys is None else c.keys.shape[2])
        if geometry not in layouts:
            layouts[geometry] = _Layout(c, tree, paths)
        offsets = mx.array([c.offset + d for d in tree.depth])
        views.append(TreeCacheView(c, offsets, layouts[geometry]))
    return views


def tree_forward(target, tree: DraftTree, views: list[TreeCacheView], layer_ids=()):
    """Logits [N, V] and the outputs of `layer_ids` [N, F] (or None) of every node.

    The target runs its layer loop (`run_layers`) over the views as if they were
    its caches, the nodes as a batch of one-token sequences."""
    tokens = mx.array(tree.tokens, dtype=mx.int32)[:, None]
    logits, features = target(tokens, views, layer_ids)
    return logits[:, 0], None if features is None else features[:, 0]


def commit(cache: list, views: list[TreeCacheView], path: list[int]) -> None:
    """Write the rows of `path` (root first) into the target caches, in place:
    bitwise the rows the sequential run would have written."""
    rows = mx.array(path, dtype=mx.int32)
    for c, v in zip(cache, views):
        keys = v.keys[rows].transpose(2, 1, 0, 3)  # [1, Hkv, len, D]
        values = v.values[rows].transpose(2, 1, 0, 3)
        c.update_and_fetch(keys, values)


def accept_tree(tree: DraftTree, logits: mx.array, sampling, transform, key, profiler) -> tuple[list[int], int]:
    """(accepted path, root first; the token after it) for node logits [N, V].

    Greedy: the target's argmax at each node. Sampled: one token per node,
    all drawn at once (a walk reads only the nodes it visits, and the draws
    are independent), then the same walk: descend while the node's token is
    a child's, else emit it. A node's token is a draw from the target's
    distribution p there; at a node whose child was itself drawn from a
    proposal q (the sampled spine), it is the standard speculative-sampling
    draw instead: that child with probability min(1, p/q), else a draw from
    the residual max(p - q, 0), which is again exactly p in total. Either
    way each emitted token is distributed as the target's next token given
    the committed prefix (docs/tree.md).
    """
    if sampling.greedy:
        return tree.walk(profiler.fetch(greedy_token(logits)))
    k_plain, k_accept, k_residual = mx.random.split(key, 3)
    logp = transform(logits)
    picks = mx.random.categorical(logp, axis=-1, key=k_plain).astype(mx.int32)
    if tree.proposals:
        parents = sorted(tree.proposals)
        rows = mx.array(parents, dtype=mx.int32)
        drawn = mx.array([tree.tokens[tree.proposals[j][0]] for j in parents], dtype=mx.int32)
        cand = mx.array([tree.proposals[j][1] for j in parents], dtype=mx.int32)
        q_rows = mx.array([tree.proposals[j][2] for j in parents], dtype=mx.float32)
        p = mx.softmax(logp[rows], axis=-1, precise=True)
        q = mx.put_along_axis(mx.zeros(p.shape, mx.float32), cand, q_rows, axis=-1)
        p_x = mx.take_along_axis(p, drawn[:, None], axis=-1)[:, 0]
        q_x = mx.take_along_axis(q, drawn[:, None], axis=-1)[:, 0]
        accept = mx.random.uniform(shape=p_x.shape, key=k_accept) * q_x < p_x
        other = mx.random.categorical(mx.log(residual(p, q)), axis=-1, key=k_residual).astype(mx.int32)
        picks = mx.put_along_axis(picks, rows, mx.where(accept, drawn, other), axis=0)
    return tree.walk(profiler.fetch(picks))
