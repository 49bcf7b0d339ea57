"""Draft trees from the drafter's candidate lattice (docs/tree.md).

A DFlash 2 drafter scores, for every block position, its top-K candidates
against each candidate of the previous position; the chain keeps one path
through those lattices. `build_tree` keeps the `rows - 1` most likely nodes
instead: the best-first union of the k best paths, a prefix tree whose
root is the anchor. A DFlash (v1) drafter has no pair scores, so its lattice
is the per-position top-K with the same row for every predecessor.

The search runs on the host over one small fetched array ([B-1, K, K]).
"""

import heapq
from typing import Callable, Optional, Sequence

import mlx.core as mx
import numpy as np

from ..logit_transform import LogitTransform
from ..drafter.propose import selector_inputs
from ..drafter.selector import score_lattice, top_k_candidates
from ..sampling import inverse_cdf

# Candidates per position for DFlash (v1) drafters: a tree of at most 16 rows
# never has more than 15 children under one node.
V1_TOP_K = 16


class DraftTree:
    """Nodes in best-first order: node 0 is the anchor, a parent always comes
    before its children, siblings carry distinct tokens."""

    def __init__(self, tokens, parents, proposals=None):
        self.tokens = tuple(int(t) for t in tokens)
        # proposals[node] = (child node, candidate tokens [K], q [K]): that child
        # was *drawn* from q (the sampled spine, T > 0); acceptance must treat it
        # by rejection sampling against q (tree_verify.accept_tree).
        self.proposals: dict[int, tuple[int, list[int], list[float]]] = dict(proposals or {})
        self.parents = tuple(int(p) for p in parents)
        depth = [0] * len(self.tokens)
        self.children: list[dict[int, int]] = [dict() for _ in self.tokens]
        for j in range(1, len(self.tokens)):
            p = self.parents[j]
            if not 0 <= p < j:
                raise ValueError(f"node {j} has parent {p}: parents must come first")
            depth[j] = depth[p] + 1
            if self.tokens[j] in self.children[p]:
                raise ValueError(f"node {p} has two children with token {self.tokens[j]}")
            self.children[p][self.tokens[j]] = j
        self.depth = tuple(depth)

    @property
    def rows(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def path(self, node: int) -> list[int]:
        """Nodes from the root to `node`, inclusive."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def walk(self, picks) -> tuple[list[int], int]:
        """Descend from the root while the target's token at the node is one
        of its children's; return (accepted path incl. the root, last token).

        `picks[j]` is the target's token at node j: its argmax (greedy) or one
        draw from its distribution (sampled). The last token is the pick at
        the node where the walk stopped (docs/tree.md: why this is exact).
        """
        node, path = 0, [0]
        while True:
            child = self.children[node].get(int(picks[node]))
            if child is None:
                return path, int(picks[node])
            node = child
            path.append(node)


def build_tree(logq: np.ndarray, cand: np.ndarray, anchor: int, rows: int,
               max_depth: Optional[int] = None, spine: Sequence[int] = (),
               admit: Optional[Callable] = None) -> DraftTree:
    """The `rows - 1` nodes of highest path log-probability, plus the anchor.

    logq [T, K, K]: log q(candidate c at position t | candidate p at t-1),
    rows normalised; position 0 reads row 0 (its predecessor is the anchor).
    cand [T, K]: the candidates' token ids. Ties go to the shallower node, then
    to the lexicographically smaller candidate ranks, so a child never comes
    before its parent (its log-probability is at most its parent's) and the
    result is fully determined by the inputs.

    `spine` (sampling): candidate indices of a path drawn from q, position by
    position; its nodes come first, each recorded as drawn from its q row
    (`DraftTree.proposals`), and the best-first nodes fill the other rows.
    `admit(path, token)` (a grammar, `grammar.PathGrammar.admits`), when given,
    keeps out every node whose token may not follow its path's drafted tokens;
    the spine's q rows are then the admitted candidates' (`spine_q`).
    """
    if rows < 2:
        raise ValueError(f"a draft tree needs at least 2 rows (anchor and one draft), got {rows}")
    T, K = cand.shape
    depth_cap = T if max_depth is None else min(T, max_depth)
    tokens, parents, proposals = [anchor], [-1], {}
    paths: list[tuple] = [()]  # each node's drafted tokens, root excluded
    heap: list = []  # (-score, depth, rank path, parent node, candidate index)

    def add(d: int, parent: int, c: int) -> int:
        tokens.append(int(cand[d - 1, c]))
        parents.append(parent)
        paths.append(paths[parent] + (tokens[-1],))
        return len(tokens) - 1

    def expand(node: int, d: int, neg: float, key: tuple, skip: int = -1) -> None:
        """Offer `node`'s children (depth d + 1) to the best-first search."""
        if d < depth_cap:
            row = logq[d, key[-1] if key else 0]
            for c in range(K):
                if c != skip and (admit is None or admit(paths[node], int(cand[d, c]))):
                    heapq.heappush(heap, (neg - float(row[c]), d + 1, key + (c,), node, c))

    node, neg, key = 0, 0.0, ()
    for d, c in enumerate(list(spine)[: min(rows - 1, depth_cap)]):
        row = logq[d, key[-1] if key else 0]
        child = add(d + 1, node, c)
        q = spine_q(row, cand[d], paths[node], admit)
        proposals[node] = (child, [int(t) for t in cand[d]], q.tolist())
        expand(node, d, neg, key, skip=c)
        node, neg, key = child, neg - float(row[c]), key + (c,)
    expand(node, len(key), neg, key)
    while heap and len(tokens) < rows:
        neg, d, key, parent, c = heapq.heappop(heap)
        expand(add(d, parent, c), d, neg, key)
    return DraftTree(tokens, parents, proposals)


def spine_q(row: np.ndarray, cand_row: Optional[np.ndarray], path: tuple, admit: Optional[Callable]) -> np.ndarray:
    """The q a spine node is drawn from: the lattice row's probabilities over the
    candidates `admit` lets follow `path` (all of them without a grammar), normalised;
    all zero when none may."""
    q = np.exp(row.astype(np.float64))
    if admit is not None:
        q = q * np.array([admit(path, int(t)) for t in cand_row], dtype=np.float64)
    total = q.sum()
    return q / total if total > 0 else q


def sample_spine(logq: np.ndarray, uniforms: np.ndarray, length: int, cand: Optional[np.ndarray] = None,
                 admit: Optional[Callable] = None) -> list[int]:
    """Candidate indices of a path drawn from the lattice, position by position
    (inverse CDF of q(. | previous pick) with the given uniforms; `spine_q`'s q
    when `admit` is given, ending where no candidate may follow)."""
    picks, prev, path = [], 0, ()
    for t in range(min(length, logq.shape[0])):
        q = spine_q(logq[t, prev], cand[t] if cand is not None else None, path, admit)
        if q.sum() == 0:
            break
        prev = inverse_cdf(q, uniforms[t])
        picks.append(prev)
        if cand is not None:
            path = path + (int(cand[t, prev]),)
    return picks


def lattice_logprobs(drafter, draft_logits: mx.array, hidden: mx.array, anchor: int,
                     temperature: float, selector_transform: LogitTransform) -> tuple[mx.array, mx.array]:
    """(logq [T, K, K], cand [T, K]) for `build_tree`, on the device.

    DFlash 2: the selector's scores (the fused kernel's twin, `score_lattice`)
    normalised per predecessor row at `temperature` (1 when greedy). DFlash:
    each position's top-K of the full-vocabulary log-softmax, the same for
    every predecessor. `selector_transform` is `Pair.selector_transform`.
    """
    temp = temperature if temperature > 0 else 1.0
    if drafter.is_dflash2:
        u, cand, pred, gate = selector_inputs(drafter, draft_logits, hidden, anchor, selector_transform)
        pred_rows, cand_rows, A, Bk = drafter.candidate_selector.codebook_rows(pred, cand)
        S = score_lattice(u, A[pred_rows], gate, Bk[cand_rows]) / temp
        return S - mx.logsumexp(S, axis=-1, keepdims=True), cand
    logits = draft_logits.astype(mx.float32) / temp
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    K = min(V1_TOP_K, logp.shape[-1] - 1)
    values, cand = top_k_candidates(logp, K)
    T = values.shape[0]
    return mx.broadcast_to(values[:, None, :], (T, K, K)), cand
