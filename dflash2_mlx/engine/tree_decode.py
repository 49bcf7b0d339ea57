"""One tree cycle of speculative decoding: draft, build the tree, verify it
in one target pass, walk it, write the accepted path into the caches.

`speculative_generate_step` runs `tree_cycle` instead of its chain cycle
when asked for tree rows (docs/tree.md); the rest of the loop is shared.
"""

import warnings
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..errors import DFlashError
from .tree import DraftTree, build_tree, lattice_logprobs
from .tree_verify import accept_tree, branch_blocker, commit, tree_forward, tree_views


@dataclass(frozen=True)
class TreeOutcome:
    tokens: tuple[int, ...]  # accepted drafts, then the target's own token
    accepted: int  # drafts accepted: the accepted path's depth
    pending: mx.array  # features [1, kept, F] of the rows now in the target cache
    tree: DraftTree
    path: tuple[int, ...]  # accepted nodes, root first


def tree_rows_for(pair, rows: int) -> int:
    """The tree rows to verify with: `rows`, or 0 (the chain) with one warning
    line when the target cannot branch in one pass."""
    if rows == 0:
        return 0
    if rows < 2:
        raise DFlashError(f"tree rows {rows}: use 0 for the chain or at least 2 (the anchor and one draft)")
    why = branch_blocker(pair.target.make_cache())
    if why is not None:
        warnings.warn(f"tree verification off: target '{pair.target.model_type}' {why}; "
                      "verifying the chain instead", stacklevel=3)
        return 0
    return rows


def tree_cycle(pair, cache, anchor: int, pending, *, block: int, rows: int, sampling, transform,
               key, left: int, profiler) -> TreeOutcome:
    """Draft a block of `block` rows, verify a tree of `rows` rows, commit at
    most `left` tokens."""
    target, drafter = pair.target, pair.drafter
    ids = mx.array([[anchor] + [pair.mask_token_id] * (block - 1)], dtype=mx.int32)
    hidden, draft_logits = drafter.draft(ids, pending, cache.drafter, target)
    profiler.lap("draft", draft_logits)
    logq, cand = lattice_logprobs(drafter, draft_logits, hidden, anchor, sampling.temperature,
                                  pair.selector_transform)
    # The search is a host loop over one small array: this cycle's first sync.
    T, K = cand.shape
    flat = profiler.fetch(mx.concatenate([logq.reshape(-1), cand.reshape(-1).astype(mx.float32)]),
                          phase="build")
    flat = np.asarray(flat, dtype=np.float32)
    tree = build_tree(flat[: T * K * K].reshape(T, K, K), flat[T * K * K :].astype(np.int64).reshape(T, K),
                      anchor, rows)
    profiler.lap("build")
    views = tree_views(cache.target, tree)
    profiler.lap("mask", *[v.layout.mask for v in views])
    logits, features = tree_forward(target, tree, views, pair.layer_ids)
    profiler.lap("verify", logits, features)
    path, last = accept_tree(tree, logits, sampling, transform, key, profiler)
    tokens = tuple(tree.tokens[n] for n in path[1:]) + (last,)
    keep = len(path)
    if len(tokens) > left:  # the tree reached past max_tokens
        tokens, keep = tokens[:left], left
    commit(cache.target, views, path[:keep])
    profiler.lap("commit", *[c.state for c in cache.target])
    kept = mx.array(path[:keep], dtype=mx.int32)
    return TreeOutcome(tokens, len(path) - 1, features[kept][None], tree, tuple(path))
