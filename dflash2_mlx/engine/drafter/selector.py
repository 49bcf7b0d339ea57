"""DFlash 2's candidate path selector (docs/algorithm.md §3, §4).

For each draft position the selector takes the drafter's top-K tokens, scores
every (predecessor candidate, candidate) pair with a rank-r trilinear term on
top of the unary logits, and walks the resulting K×K lattices left to right.

`path_select` is the unit a fused kernel replaces (gather, gate, score, walk in
one launch); `path_select_ops` is its plain-MLX twin and the specification.
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ...kernels import metal_cuda, registry


def top_k_candidates(logits: mx.array, K: int) -> tuple[mx.array, mx.array]:
    """Exact top-K of each row, ordered by (value desc, index asc).

    Ties at the K-th value are broken towards the smallest index, so the set
    and its order are fully determined by the logits on every backend.
    Returns float32 values [N, K] and int32 indices [N, K].
    """
    logits = logits.astype(mx.float32)
    N, V = logits.shape
    if K >= V:
        raise ValueError(f"selector_top_k {K} must be smaller than the vocabulary ({V})")
    threshold = mx.min(mx.topk(logits, K, axis=-1), axis=-1, keepdims=True)
    above = logits > threshold
    at = logits == threshold
    room = K - mx.sum(above, axis=-1, keepdims=True)
    chosen = above | (at & (mx.cumsum(at.astype(mx.int32), axis=-1) <= room))
    # Exactly K entries are chosen: partitioning the 0/1 flags puts them first.
    idx = mx.argpartition(mx.logical_not(chosen).astype(mx.uint8), K - 1, axis=-1)[:, :K]
    idx = mx.sort(idx, axis=-1)
    vals = mx.take_along_axis(logits, idx, axis=-1)
    # Rank each winner: how many others beat it (larger value, or equal and
    # smaller index, which is every equal one to its left after the sort).
    beats = (vals[:, None, :] > vals[:, :, None]) | (
        (vals[:, None, :] == vals[:, :, None])
        & (mx.arange(K)[None, None, :] < mx.arange(K)[None, :, None])
    )
    rank = mx.sum(beats, axis=-1)
    order = mx.argsort(rank, axis=-1)
    return mx.take_along_axis(vals, order, axis=-1), mx.take_along_axis(idx, order, axis=-1).astype(mx.int32)


def score_lattice(
    unary: mx.array, pred_rows: mx.array, gate: mx.array, succ_rows: mx.array
) -> mx.array:
    """S[n, p, c] = unary[n, c] + Σ_r pred_rows[n, p, r]·gate[n, r]·succ_rows[n, c, r]."""
    gated = pred_rows.astype(mx.float32) * gate.astype(mx.float32)[:, None, :]
    pair = gated @ succ_rows.astype(mx.float32).transpose(0, 2, 1)
    return unary.astype(mx.float32)[:, None, :] + pair


def walk_greedy(S: mx.array) -> mx.array:
    """i_1 = argmax S_1[0]; i_t = argmax S_t[i_{t-1}]; ties to the smallest index."""
    N = S.shape[0]
    prev = mx.array(0, dtype=mx.int32)
    picks = []
    for t in range(N):
        prev = mx.argmax(S[t][prev], axis=-1).astype(mx.int32)
        picks.append(prev)
    return mx.stack(picks)


def walk_sampled(S: mx.array, uniforms: mx.array, temperature: float) -> tuple[mx.array, mx.array]:
    """Sample i_t ~ softmax(S_t[i_{t-1}] / T) by inverse CDF with pre-drawn uniforms.

    Returns the picks [N] and the proposal rows actually used [N, K] (float32),
    which exact rejection sampling needs.
    """
    N, K, _ = S.shape
    prev = mx.array(0, dtype=mx.int32)
    picks, rows = [], []
    index = mx.arange(K)
    for t in range(N):
        q = mx.softmax(S[t][prev] / temperature, axis=-1, precise=True)
        cdf = mx.cumsum(q, axis=-1)
        # The fp32 CDF can end below 1 (e.g. 1 - 2^-23) and u can lie above it.
        # Clamping to K - 1 could then pick a candidate whose q underflowed to 0,
        # which verification would always accept (p / q = inf): clamp to the last
        # candidate with q > 0 instead (one exists: the maximum's q is >= 1/K).
        last = mx.max(mx.where(q > 0, index, 0))
        prev = mx.minimum(mx.sum(cdf <= uniforms[t]), last).astype(mx.int32)
        picks.append(prev)
        rows.append(q)
    return mx.stack(picks), mx.stack(rows)


def path_select_ops(
    unary: mx.array,
    pred_ids: mx.array,
    cand_ids: mx.array,
    gate: mx.array,
    pred_codebook: mx.array,
    succ_codebook: mx.array,
    temperature: float = 0.0,
    uniforms: Optional[mx.array] = None,
) -> tuple[mx.array, mx.array]:
    """Twin of the fused path-selection kernel.

    unary [N, K], pred_ids / cand_ids [N, K] int32 rows into the codebooks,
    gate [N, r], codebooks [V, r]. Greedy when temperature is 0 (q rows are
    one-hot), otherwise sampled with `uniforms` [N]. Returns (picks [N] int32,
    q_rows [N, K] float32).
    """
    S = score_lattice(unary, pred_codebook[pred_ids], gate, succ_codebook[cand_ids])
    if temperature == 0:
        picks = walk_greedy(S)
        K = unary.shape[-1]
        return picks, (mx.arange(K)[None, :] == picks[:, None]).astype(mx.float32)
    return walk_sampled(S, uniforms, temperature)


def path_select(*args, **kwargs) -> tuple[mx.array, mx.array]:
    """Score and walk the lattices; fused kernel when active, else the twin."""
    kernel = registry.active("path_select", agrees_with_twin)
    if kernel is not None:
        return kernel(*args, **kwargs)
    return path_select_ops(*args, **kwargs)


def agrees_with_twin(kernel) -> None:
    """Raise unless `kernel` matches the twin, greedy and sampled, on a small
    fixed problem (run once when a fused kernel is built)."""
    args, uniforms = metal_cuda.path_check_problem()
    for temperature, u in ((0.0, None), (1.0, uniforms)):
        picks, q = kernel(*args, temperature=temperature, uniforms=u)
        want_picks, want_q = path_select_ops(*args, temperature=temperature, uniforms=u)
        if not (mx.array_equal(picks, want_picks).item()
                and mx.allclose(q, want_q, rtol=1e-5, atol=1e-6).item()):
            raise RuntimeError(f"disagrees with selector.path_select_ops at temperature {temperature}")



class CandidateSelector(nn.Module):
    """`candidate_selector`: the predecessor codebook (A of docs/algorithm.md §3), the successor
    codebook (B) and the gate projection."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        # B = 0 so the initial scores are the drafter's own logits (docs/algorithm.md §3).
        self.successor_codebook.weight = mx.zeros_like(self.successor_codebook.weight)

    def true_predecessor_scores(self, unary: mx.array, cand: mx.array, hidden: mx.array,
                                pred: mx.array) -> mx.array:
        """Teacher-forced scores [N, K]: one lattice row per position, the row of
        the true previous token `pred` [N] (training loss and analysis)."""
        gate = self.hidden_projection(hidden).astype(mx.float32)
        a = self.predecessor_codebook(pred).astype(mx.float32) * gate  # [N, r]
        b = self.successor_codebook(cand).astype(mx.float32)  # [N, K, r]
        return unary + mx.sum(a[:, None, :] * b, axis=-1)

    def codebook_rows(self, pred_ids: mx.array, cand_ids: mx.array):
        """Tables and row ids for `path_select`.

        Plain codebooks are passed whole (the kernel gathers); quantized ones are
        dequantized only for the rows this cycle needs.
        """
        pred_book, succ_book = self.predecessor_codebook, self.successor_codebook
        if isinstance(pred_book, nn.Embedding) and isinstance(succ_book, nn.Embedding):
            return pred_ids, cand_ids, pred_book.weight, succ_book.weight
        N, K = cand_ids.shape
        local = mx.arange(N * K, dtype=mx.int32).reshape(N, K)
        return local, local, pred_book(pred_ids).reshape(N * K, -1), succ_book(cand_ids).reshape(N * K, -1)
