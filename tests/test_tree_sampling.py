"""Sampling through a draft tree reproduces the target's own distribution.

The same chi-square test as tests/test_sampling.py (8-token vocabulary, the
exact joint distribution of the first three tokens, fixed seeds): the tree's
rule must pass it, and a plausible wrong rule must fail it. Below, a white-box
check of every sampled spine node's pick against its own row's p, pooled over
many cycles (the first three tokens rarely reach a node below the root).
"""

import mlx.core as mx
import numpy as np
import pytest

import dflash2_mlx.engine.tree.cycle as tree_decode
import dflash2_mlx.engine.tree.verify as tree_verify
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams
from helpers import decode_steps, pick_pvalues
from test_sampling import ALPHA, PROMPT, exact_distribution, gof_pvalue, sample_counts, tiny_drafter, tiny_target

N_SAMPLES = 500
# The residual bug (resample from p after a spine rejection) is subtle: at T = 1 with 500 samples
# it failed for seeds 0-499 (p = 7e-5) and passed for 500-999 (p = 0.38). With top_k = 3 and 1,000
# samples it fails for each of seeds 0-999, 1000-1999 and 2000-2999 (p = 1e-8, 2e-6, 3e-8), so the
# sampled spine's rule and its wrong twin are both tested there.
SPINE = SamplingParams(temperature=1.0, top_k=3)
N_SPINE = 1000


@pytest.fixture(scope="module")
def pair():
    target, cfg = tiny_target()
    return target, {k: tiny_drafter(cfg, k) for k in ("dflash", "dflash2")}


def _tree(target, drafter, settings, rows):
    def gen(seed):
        s = SamplingParams(settings.temperature, settings.top_p, settings.top_k, settings.min_p, seed)
        return decode_steps(PROMPT, Pair.make(target, drafter),
                            DecodeRequest(max_tokens=3, sampling=s, block_size=None, tree_rows=rows), tree_only=True)
    return gen


@pytest.mark.slow
@pytest.mark.parametrize("kind,settings,rows,n", [
    ("dflash2", SPINE, 7, N_SPINE),
    ("dflash", SamplingParams(temperature=0.8, top_p=0.9), 6, N_SAMPLES),
], ids=["dflash2-t1-top_k3-N7", "dflash-t0.8-top_p0.9-N6"])
def test_tree_sampling_matches_target_distribution(pair, kind, settings, rows, n):
    target, drafters = pair
    table = exact_distribution(target, settings)
    p = gof_pvalue(sample_counts(_tree(target, drafters[kind], settings, rows), n), table, n)
    print(f"tree {kind} N={rows} {settings}: chi-square p = {p:.3g}")
    assert p > ALPHA, f"chi-square p = {p:.2e}"


def _first_child_rule(tree, logits, sampling, transform, key, profiler):
    """A plausible but wrong rule: when the draw at a node is any child, take
    the node's first (most likely) child instead of the drawn one."""
    picks = mx.random.categorical(transform(logits), axis=-1, key=key).astype(mx.int32)
    picks = profiler.fetch(picks)
    node, path = 0, [0]
    while True:
        children = tree.children[node]
        if int(picks[node]) not in children:
            return path, int(picks[node])
        node = min(children.values())
        path.append(node)


@pytest.mark.slow
def test_wrong_tree_rule_fails_the_same_test(pair, monkeypatch):
    target, drafters = pair
    settings = SamplingParams(temperature=1.0)
    table = exact_distribution(target, settings)
    monkeypatch.setattr(tree_decode, "accept_tree", _first_child_rule)
    p = gof_pvalue(sample_counts(_tree(target, drafters["dflash2"], settings, 4), N_SAMPLES), table, N_SAMPLES)
    print(f"wrong tree rule: chi-square p = {p:.3g}")
    assert p < ALPHA, f"the wrong rule passed: chi-square p = {p:.2e}"


@pytest.mark.slow
def test_resampling_from_p_after_a_spine_rejection_fails_the_same_test(pair, monkeypatch):
    """The sampled spine's plausible bug: after rejecting the drawn child, draw
    from p instead of the residual max(p - q, 0)."""
    target, drafters = pair
    table = exact_distribution(target, SPINE)
    monkeypatch.setattr(tree_verify, "residual", lambda p, q: p)
    # 7 rows: a spine over all three positions, so rejections are frequent.
    p = gof_pvalue(sample_counts(_tree(target, drafters["dflash2"], SPINE, 7), N_SPINE), table, N_SPINE)
    print(f"residual from p: chi-square p = {p:.3g}")
    assert p < ALPHA, f"the wrong rule passed: chi-square p = {p:.2e}"


# The white-box check below: each spine node's pick (the drawn child kept with
# probability min(1, p/q), else a residual draw) is, given the node's row, a
# draw from that row's p. Pooled over many cycles, two chi-square tests at ALPHA:
# randomized PIT values u = F(x - 1) + v p(x) (uniform whatever the rows) on
# equal bins, and each token's count against the sum of its p over the picks
# (helpers.pick_pvalues).
# Nodes below the root are pooled apart: the first-three-token tests above rarely
# reach them. A top-k of 3 over the tiny vocabulary keeps p and q apart, so siblings
# are often rejected.
PIT_SEQUENCES, PIT_TOKENS = 60, 24


def _spine_picks(target, drafter, settings, monkeypatch):
    """{"root": ..., "below": ...}: (picked token, its row's p [V]) of every spine node."""
    from dflash2_mlx.engine.tree.build import DraftTree

    seen, real_accept, real_walk = {}, tree_decode.accept_tree, DraftTree.walk
    picks_at = {"root": [], "below": []}

    def accept(tree, logits, sampling, transform, key, profiler):
        seen.update(tree=tree, p=np.array(mx.softmax(transform(logits), axis=-1, precise=True), dtype=np.float64))
        return real_accept(tree, logits, sampling, transform, key, profiler)

    def walk(tree, picks):
        if seen.get("tree") is tree:
            for j in tree.proposals:
                picks_at["root" if j == 0 else "below"].append((int(picks[j]), seen["p"][j]))
        return real_walk(tree, picks)

    monkeypatch.setattr(tree_decode, "accept_tree", accept)
    monkeypatch.setattr(DraftTree, "walk", walk)
    for seed in range(PIT_SEQUENCES):
        s = SamplingParams(settings.temperature, settings.top_p, settings.top_k, settings.min_p, seed)
        request = DecodeRequest(max_tokens=PIT_TOKENS, sampling=s, block_size=None, tree_rows=7)
        for _ in decode_steps(PROMPT, Pair.make(target, drafter), request, tree_only=True):
            pass
    return picks_at


def test_every_spine_node_picks_from_its_own_rows_p(pair, monkeypatch):
    """Fails when a spine node is accepted and resampled with the q of the node
    above it (measured below the root: PIT p = 9e-14, token counts p = 4e-19), or
    when only its residual uses that q (PIT p = 9e-5, token counts p = 2e-6)."""
    target, drafters = pair
    picks = _spine_picks(target, drafters["dflash2"], SPINE, monkeypatch)
    assert len(picks["below"]) >= 2000, len(picks["below"])
    for where, at in picks.items():
        pit, counts = pick_pvalues(at)
        print(f"spine {where}: {len(at)} picks, PIT chi-square p = {pit:.3g}, token counts p = {counts:.3g}")
        assert min(pit, counts) > ALPHA, f"spine nodes {where}: p = {pit:.2e} (PIT), {counts:.2e} (tokens)"
