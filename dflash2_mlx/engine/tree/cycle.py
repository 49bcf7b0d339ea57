"""One tree cycle of speculative decoding: draft, build the tree, verify it
in one target pass, walk it, write the accepted path into the caches.

The decode loop runs `tree_cycle` instead of the chain cycle when asked for
tree rows (docs/tree.md); both return a `CycleOutcome` for the loop's one
commit tail.
"""

import warnings
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ...errors import DFlashError
from ..decode.state import CycleOutcome
from ..grammar import PathGrammar
from ..sampling import split_key
from .build import V1_TOP_K, build_tree, lattice_logprobs, sample_spine
from .verify import accept_tree, branch_blocker, commit, tree_forward, tree_views


def max_tree_rows(drafter) -> int:
    """The most rows a tree from `drafter`'s lattice can hold: the anchor and one
    node per candidate the lattice has, 1 + (block_size - 1) × top-K."""
    K = drafter.config.selector_top_k if drafter.is_dflash2 else min(V1_TOP_K, drafter.config.vocab_size - 1)
    return 1 + (drafter.config.block_size - 1) * K


def check_tree_rows(pair, rows: int, name: str = "tree rows") -> None:
    """Raise DFlashError (naming `name`) unless `rows` (0: the chain; the request
    checked the rest, `request.tree_rows_value`) is a tree the pair's drafter can
    fill; with no drafter there is no tree."""
    if rows == 0 or pair.drafter is None:
        return
    most = max_tree_rows(pair.drafter)
    if rows > most:
        c = pair.drafter.config
        raise DFlashError(f"{name} {rows:,}: this drafter's lattice holds {c.block_size - 1} positions × "
                          f"{(most - 1) // (c.block_size - 1)} candidates, so a tree has at most {most} rows "
                          f"(the anchor and one per candidate): ask for {most} or fewer (8 or 16 is usual)")


def tree_rows_for(pair, rows: int) -> int:
    """The tree rows to verify with: `rows`, or 0 (the chain) with one warning
    line when the target cannot branch in one pass."""
    check_tree_rows(pair, rows, "tree_rows")
    if rows == 0:
        return 0
    why = branch_blocker(pair.target.make_cache())
    if why is not None:
        warnings.warn(f"tree verification off: target '{pair.target.model_type}' {why}; "
                      "verifying the chain instead", stacklevel=3)
        return 0
    return rows


def spine_length(rows: int, positions: int) -> int:
    """Sampled-spine nodes of a tree of `rows` rows when sampling: about half the
    rows, so the rest can branch off it (chosen on prompts outside the benchmark's)."""
    return max(1, min(positions, (rows - 1) // 2))


def tree_cycle(pair, cache, anchor: int, pending, *, block: int, rows: int, sampling, transform,
               key, left: int, profiler, rule=None) -> CycleOutcome:
    """Draft a block of `block` rows, verify a tree of `rows` rows, commit at
    most `left` tokens. `pending`: features of the committed rows the drafter
    has not seen (it takes them into its cache now). `rule` (decode/rows.py):
    each node's row after its own path (processors, the grammar's mask), and
    under a grammar only nodes it allows."""
    profiler.start()
    target, drafter = pair.target, pair.drafter
    ids = mx.array([[anchor] + [pair.mask_token_id] * (block - 1)], dtype=mx.int32)
    hidden, draft_logits = drafter.draft(ids, pending, cache.drafter, target)
    profiler.lap("draft", draft_logits)
    planned = plan_tree(pair, anchor, hidden, draft_logits, rows=rows, sampling=sampling, key=key, rule=rule,
                        profiler=profiler)
    views = tree_views(cache.target, planned.tree)
    profiler.lap("mask", *[v.layout.mask for v in views])
    logits, features = tree_forward(target, planned.tree, views, pair.layer_ids)
    profiler.lap("verify", logits, features)
    if features is not None:  # evaluated with the pass, not left holding its graph (decode/plain.py)
        mx.async_eval(features)
    return finish_tree(planned, cache, views, logits, features, sampling=sampling, transform=transform, left=left,
                       rule=rule, profiler=profiler)


@dataclass(frozen=True)
class PlannedTree:
    """A tree built from one drafted block, before its target pass."""

    tree: object  # build.DraftTree
    key: object  # what acceptance draws with
    paths: object  # the grammar's view of paths (None without a grammar)


def plan_tree(pair, anchor: int, hidden, draft_logits, *, rows: int, sampling, key, rule, profiler) -> PlannedTree:
    """Build the tree of `rows` rows from a drafted block's lattice (the cycle's first host sync)."""
    logq, cand = lattice_logprobs(pair.drafter, draft_logits, hidden, anchor, sampling.temperature,
                                  pair.selector_transform)
    # The search is a host loop over one small array. (Token ids travel as float32: exact below 2**24.)
    T, K = cand.shape
    key, k_spine = split_key(key)
    uniforms = mx.zeros((T,)) if sampling.greedy else mx.random.uniform(shape=(T,), key=k_spine)
    flat = profiler.fetch(mx.concatenate([logq.reshape(-1), cand.reshape(-1).astype(mx.float32), uniforms]),
                          phase="build")
    flat = np.asarray(flat, dtype=np.float32)
    logq_host = flat[: T * K * K].reshape(T, K, K)
    cand_host = flat[T * K * K : T * K * K + T * K].astype(np.int64).reshape(T, K)
    paths = PathGrammar(rule.grammar) if rule is not None and rule.grammar is not None else None
    admit = paths.admits if paths is not None else None
    spine = () if sampling.greedy else sample_spine(logq_host, flat[T * K * K + T * K :], spine_length(rows, T),
                                                    cand_host, admit)
    tree = build_tree(logq_host, cand_host, anchor, rows, spine=spine, admit=admit)
    profiler.lap("build")
    return PlannedTree(tree, key, paths)


def finish_tree(planned: PlannedTree, cache, views, logits, features, *, sampling, transform, left: int, rule,
                profiler) -> CycleOutcome:
    """Walk the verified tree (node logits [N, V], features [N, F]), write the accepted
    path into the target caches, and say what the cycle commits (at most `left` tokens)."""
    tree, paths = planned.tree, planned.paths
    if rule is not None:
        drafted = [tuple(tree.tokens[m] for m in tree.path(j)[1:]) for j in range(tree.rows)]
        masks = np.stack([paths.allowed(p) for p in drafted]) if paths is not None else None
        logits = rule.tree(logits, cache.tokens, drafted, masks)
    path, last = accept_tree(tree, logits, sampling, transform, planned.key, profiler)
    tokens = tuple(tree.tokens[n] for n in path[1:]) + (last,)
    keep = len(path)
    if len(tokens) > left:  # the tree reached past max_tokens
        tokens, keep = tokens[:left], left
    commit(cache.target, views, path[:keep])
    profiler.lap("commit", *[c.state for c in cache.target])
    kept = mx.array(path[:keep], dtype=mx.int32)
    # Trees run on attention caches only: they trim, so there is no undo record.
    logprobs = rule.logprobs(logits[mx.array(path[: len(tokens)])], tokens) if rule is not None else None
    return CycleOutcome(tokens, accepted=len(path) - 1, drafted=tree.max_depth, verify_rows=tree.rows,
                        features=None if features is None else features[kept][None], logprobs=logprobs)
