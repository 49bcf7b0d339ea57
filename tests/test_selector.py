"""The selector twins against brute-force references (docs/algorithm.md §3, §4)."""

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.logit_transform import LogitTransform, apply_logit_transform
from dflash2_mlx.engine.drafter.selector import (
    path_select_ops,
    score_lattice,
    top_k_candidates,
    walk_greedy,
    walk_sampled,
)


def brute_greedy(S):
    """Literal reading of the spec, with Python's strict '>' (ties -> smallest index)."""
    picks, prev = [], 0
    for t in range(S.shape[0]):
        row = S[t, prev]
        best = 0
        for c in range(1, len(row)):
            if row[c] > row[best]:
                best = c
        picks.append(best)
        prev = best
    return picks


@pytest.mark.parametrize("seed", range(20))
def test_greedy_walk_matches_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    N, K = rng.integers(1, 16), 16
    # Small integers make ties frequent, including along the path.
    S = rng.integers(0, 3, size=(N, K, K)).astype(np.float32)
    assert walk_greedy(mx.array(S)).tolist() == brute_greedy(S)


def test_greedy_walk_is_not_viterbi():
    # Position 1 prefers c=0, but from c=0 position 2 only offers 1; from c=1 it offers 10.
    S = np.zeros((2, 2, 2), np.float32)
    S[0, 0] = [2.0, 1.9]
    S[1, 0] = [1.0, 0.0]
    S[1, 1] = [10.0, 0.0]
    assert walk_greedy(mx.array(S)).tolist() == [0, 0]


def brute_top_k(row, K):
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:K]
    return [row[i] for i in order], order


@pytest.mark.parametrize("seed", range(10))
def test_top_k_order_and_boundary_ties(seed):
    rng = np.random.default_rng(seed)
    logits = rng.integers(-3, 3, size=(5, 64)).astype(np.float32)  # many ties at the K-th value
    vals, idx = top_k_candidates(mx.array(logits), 16)
    for r in range(5):
        ref_vals, ref_idx = brute_top_k(list(logits[r]), 16)
        assert idx[r].tolist() == ref_idx
        assert vals[r].tolist() == ref_vals


def test_unary_transform():
    v = mx.array([[40.0, 1.0, -40.0]])
    assert np.allclose(apply_logit_transform(v, LogitTransform(0.5, None)), [[20.0, 0.5, -20.0]])
    capped = np.array(apply_logit_transform(v, LogitTransform(1.0, 20.0)))
    assert np.allclose(capped, 20.0 * np.tanh(np.array([[40.0, 1.0, -40.0]]) / 20.0), atol=1e-5)


def test_lattice_matches_einsum_and_zero_successor_gives_unary():
    rng = np.random.default_rng(0)
    N, K, r = 5, 16, 8
    unary = rng.normal(size=(N, K)).astype(np.float32)
    A = rng.normal(size=(N, K, r)).astype(np.float32)
    g = rng.normal(size=(N, r)).astype(np.float32)
    Bm = rng.normal(size=(N, K, r)).astype(np.float32)
    S = np.array(score_lattice(mx.array(unary), mx.array(A), mx.array(g), mx.array(Bm)))
    ref = unary[:, None, :] + np.einsum("npr,nr,ncr->npc", A, g, Bm)
    assert np.allclose(S, ref, atol=1e-4)
    S0 = np.array(score_lattice(mx.array(unary), mx.array(A), mx.array(g), mx.zeros((N, K, r))))
    assert np.array_equal(S0, np.broadcast_to(unary[:, None, :], S0.shape))


def test_sampled_walk_matches_inverse_cdf_reference():
    rng = np.random.default_rng(1)
    N, K, T = 7, 16, 0.7
    S = rng.normal(size=(N, K, K)).astype(np.float32)
    u = rng.uniform(size=N).astype(np.float32)
    picks, rows = walk_sampled(mx.array(S), mx.array(u), T)
    prev = 0
    for t in range(N):
        q = np.exp((S[t, prev] - S[t, prev].max()) / T)
        q /= q.sum()
        assert np.allclose(np.array(rows[t]), q, atol=1e-6)
        expect = min(int(np.sum(np.cumsum(np.array(rows[t])) <= u[t])), K - 1)
        assert picks[t].item() == expect
        prev = expect


def test_path_select_greedy_q_rows_are_one_hot_and_codebooks_gather():
    rng = np.random.default_rng(2)
    N, K, r, V = 4, 16, 8, 50
    unary = mx.array(rng.normal(size=(N, K)).astype(np.float32))
    cand = mx.array(np.stack([rng.permutation(V)[:K] for _ in range(N)]).astype(np.int32))
    pred = mx.concatenate([mx.full((1, K), 3, mx.int32), cand[:-1]])
    gate = mx.array(rng.normal(size=(N, r)).astype(np.float32))
    A = mx.array(rng.normal(size=(V, r)).astype(np.float32))
    Bm = mx.array(rng.normal(size=(V, r)).astype(np.float32))
    picks, q = path_select_ops(unary, pred, cand, gate, A, Bm)
    S = score_lattice(unary, A[pred], gate, Bm[cand])
    assert picks.tolist() == brute_greedy(np.array(S))
    assert np.array_equal(np.array(q), np.eye(K, dtype=np.float32)[np.array(picks)])
