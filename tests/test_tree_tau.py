"""A sampled tree commits at least as much as the chain of the same rows, where the answer is known.

Issue 38 (2): a scripted drafter and target, no weights. The target's distribution p is the same
after every prefix and puts 0.85 on token 1; the drafter's lattice proposes tokens 1-4 at every
position with an under-confident q = (0.4, 0.2, 0.2, 0.2). The chain of N rows draws N - 1 tokens
from q and accepts each with probability a = sum min(p, q) = 0.53, so its expected committed
tokens per pass is exactly 1 + a + ... + a^(N-1) = 2.114 (N = 8). The tree's sampled spine is
accepted as often, and after a spine rejection the residual max(p - q, 0) sits on token 1 alone,
a best-first sibling of the spine, so the walk goes on where the chain stops: about 2.96.

The tree is run through the engine's own `sample_spine`, `build_tree` and `accept_tree` (the
rules tree_cycle uses), over fixed seeds; it must not fall below the chain by more than three
standard errors of its mean (a one-sided margin: a tree exactly as good as the chain would fail
with probability 0.13 %). Rules that drop what the branches add fail it (below).

Where the tree alone does not hold: a drafter whose q is close to p on its candidates leaves the
residual no mass on them, so siblings of the spine are unreachable and a spine of half the rows
loses to the chain's full depth (q = p renormalised over tokens 1-4: tree 5.57 against the chain's
7.46). There the request's shape choice (engine/tree/shape.py) runs the chain of the same rows
after measuring both; the last tests check that what it commits stays at the chain's or above, on
that case and on the one where the tree wins.
"""

import mlx.core as mx
import numpy as np
import pytest

import dflash2_mlx.engine.tree.build as tree_build
from dflash2_mlx.engine.decode.profile import CycleProfiler
from dflash2_mlx.engine.sampling import SamplingParams, make_logprobs_transform
from dflash2_mlx.engine.tree.build import build_tree, sample_spine
from dflash2_mlx.engine.tree.cycle import spine_length
from dflash2_mlx.engine.tree.verify import accept_tree

V, K, T, N = 16, 4, 7, 8  # vocabulary, candidates per position, lattice positions, rows
TRIALS = 3000
Z = 3.0  # one-sided margin in standard errors


def _scripted():
    p = np.full(V, 0.02 / (V - 4))
    p[1:5] = [0.85, 0.05, 0.05, 0.03]
    q = np.array([0.4, 0.2, 0.2, 0.2])
    logq = np.broadcast_to(np.log(q), (T, K, K)).astype(np.float32).copy()
    cand = np.tile(np.arange(1, K + 1), (T, 1))
    return p, q, logq, cand


def chain_tau(p, q, rows: int) -> float:
    """Exact expected tokens per pass of the sampled chain of `rows` rows when p and q do not
    depend on the prefix: draft t is reached with probability a^(t-1), a = sum min(p, q)."""
    a = float(np.minimum(p[1 : K + 1], q).sum())
    return 1.0 + sum(a**k for k in range(1, rows))


def tree_taus(p, logq, cand, rows: int, trials: int, build=build_tree, length=spine_length, first: int = 0) -> np.ndarray:
    """Tokens per pass of `trials` sampled trees (spine, best-first rows, `accept_tree`'s walk);
    `first`: the seed of the first."""
    sampling = SamplingParams(temperature=1.0, seed=0)
    transform, profiler = make_logprobs_transform(sampling), CycleProfiler()
    logits = mx.array(np.tile(np.log(p), (rows, 1)).astype(np.float32))
    rng = np.random.default_rng(first)
    out = []
    for i in range(first, first + trials):
        spine = sample_spine(logq, rng.random(T), length(rows, T), cand)
        tree = build(logq, cand, 0, rows, spine=spine)
        path, _ = accept_tree(tree, logits, sampling, transform, mx.random.key(i), profiler)
        out.append(len(path))  # accepted nodes + the token after them
    return np.asarray(out, dtype=np.float64)


def _check(taus: np.ndarray, chain: float) -> None:
    mean, se = taus.mean(), taus.std(ddof=1) / np.sqrt(len(taus))
    print(f"tree tau {mean:.3f} (se {se:.3f}) vs chain {chain:.3f}")
    assert mean >= chain - Z * se, f"tree tau {mean:.3f} < chain {chain:.3f} - {Z} se ({se:.3f})"


def test_chain_formula_matches_the_chain_rule():
    """The chain's exact τ, checked against sampling its rule (draft from q, accept while u·q < p)."""
    p, q, _, _ = _scripted()
    rng = np.random.default_rng(1)
    pc = p[1 : K + 1]
    taus = []
    for _ in range(20000):
        n = 1
        for _ in range(N - 1):
            c = rng.choice(K, p=q)
            if rng.random() * q[c] >= pc[c]:
                break
            n += 1
        taus.append(n)
    assert abs(np.mean(taus) - chain_tau(p, q, N)) < 4 * np.std(taus) / np.sqrt(len(taus))


def test_sampled_tree_commits_at_least_the_chain_of_the_same_rows():
    p, q, logq, cand = _scripted()
    _check(tree_taus(p, logq, cand, N, TRIALS), chain_tau(p, q, N))


def test_a_tree_that_is_all_spine_commits_what_the_chain_does():
    """Every row on the spine is the chain (drawn from q, accepted by min(1, p/q)): equal τ, two-sided."""
    p, q, logq, cand = _scripted()
    taus = tree_taus(p, logq, cand, N, TRIALS, length=lambda rows, positions: rows - 1)
    se = taus.std(ddof=1) / np.sqrt(len(taus))
    assert abs(taus.mean() - chain_tau(p, q, N)) < 4 * se, (taus.mean(), chain_tau(p, q, N), se)


def _stop_at_a_spine_rejection(self, picks):
    """A plausible regression that keeps the output exact: after a spine node's rejection the
    residual draw is emitted, never followed into the best-first sibling it may be."""
    node, path = 0, [0]
    while True:
        child = self.children[node].get(int(picks[node]))
        if child is None or (node in self.proposals and self.proposals[node][0] != child):
            return path, int(picks[node])
        node = child
        path.append(node)


def test_a_walk_that_stops_at_spine_rejections_fails_the_same_test(monkeypatch):
    p, q, logq, cand = _scripted()
    monkeypatch.setattr(tree_build.DraftTree, "walk", _stop_at_a_spine_rejection)
    with pytest.raises(AssertionError):
        _check(tree_taus(p, logq, cand, N, TRIALS), chain_tau(p, q, N))


CYCLES = 1500  # cycles of the shape choice: its few tree cycles after exploring cost little


def chain_pass(p, q, rng, rows: int = N) -> int:
    """One sampled chain pass: draft from q, accept while u·q < p; its tokens (the bonus included)."""
    pc, n = p[1 : K + 1], 1
    for _ in range(rows - 1):
        c = rng.choice(K, p=q)
        if rng.random() * q[c] >= pc[c]:
            break
        n += 1
    return n


def shape_choice_taus(p, q, logq, cand, choice_cls) -> np.ndarray:
    """Tokens per pass of CYCLES cycles whose shape a `choice_cls()` picks, as the decode loops ask it."""
    choice, rng, out = choice_cls(), np.random.default_rng(5), []
    for i in range(CYCLES):
        tree = choice.next_is_tree()
        n = int(tree_taus(p, logq, cand, N, 1, first=10_000 + i)[0]) if tree else chain_pass(p, q, rng)
        choice.observe(tree, n)
        out.append(n)
    return np.asarray(out, dtype=np.float64)


def _confident():
    """The case where the tree alone loses: q is p renormalised over the four candidates."""
    p, _, _, cand = _scripted()
    q = p[1 : K + 1] / p[1 : K + 1].sum()
    return p, q, np.broadcast_to(np.log(q), (T, K, K)).astype(np.float32).copy(), cand


def test_the_tree_alone_loses_where_the_drafter_is_sure():
    p, q, logq, cand = _confident()
    assert tree_taus(p, logq, cand, N, 300).mean() < chain_tau(p, q, N) - 1.0  # about 5.6 against 7.46


@pytest.mark.parametrize("case", ["confident", "under-confident"])
def test_the_shape_choice_commits_at_least_the_chain(case):
    from dflash2_mlx.engine.tree.shape import ShapeChoice

    p, q, logq, cand = _confident() if case == "confident" else _scripted()
    _check(shape_choice_taus(p, q, logq, cand, ShapeChoice), chain_tau(p, q, N))


def test_a_choice_that_always_runs_the_tree_fails_the_same_test():
    from dflash2_mlx.engine.tree.shape import ShapeChoice

    class TreeAlways(ShapeChoice):
        def next_is_tree(self):
            return True

    p, q, logq, cand = _confident()
    with pytest.raises(AssertionError):
        _check(shape_choice_taus(p, q, logq, cand, TreeAlways), chain_tau(p, q, N))

