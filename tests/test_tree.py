"""The draft tree: construction from the lattice, the walk, and one pass over it."""

import itertools
import warnings

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.decode.loop import DecodeCache
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.tree.build import DraftTree, build_tree, lattice_logprobs
from dflash2_mlx.engine.tree.verify import commit, tree_forward, tree_views
from helpers import ar_tokens, decode_steps, load_pair_for, node_ranks


def _lattice(T=3, K=3, seed=0):
    rng = np.random.RandomState(seed)
    S = rng.randn(T, K, K).astype(np.float32)
    logq = S - np.log(np.exp(S).sum(-1, keepdims=True))
    cand = rng.permutation(50)[: T * K].reshape(T, K) + 2
    return logq, cand


def _brute_force(logq, cand, n):
    """Every path of every depth with its score; the n best (ties: shallower, smaller ranks)."""
    T, K = cand.shape
    nodes = []
    for d in range(1, T + 1):
        for ranks in itertools.product(range(K), repeat=d):
            score = logq[0, 0, ranks[0]] + sum(logq[t, ranks[t - 1], ranks[t]] for t in range(1, d))
            nodes.append((-score, d, ranks))
    return {ranks for _, _, ranks in sorted(nodes)[:n]}


def _rank_paths(tree: DraftTree, cand):
    ranks = node_ranks(tree, cand)
    return {tuple(ranks[j] for j in tree.path(node)[1:]) for node in range(1, tree.rows)}


@pytest.mark.parametrize("rows", [2, 4, 8, 16, 30])
def test_build_tree_keeps_the_best_paths_as_a_prefix_tree(rows):
    logq, cand = _lattice()
    tree = build_tree(logq, cand, anchor=1, rows=rows)
    assert tree.rows == rows and tree.tokens[0] == 1
    assert _rank_paths(tree, cand) == _brute_force(logq, cand, rows - 1)
    for j in range(1, rows):  # parents first, tokens from the right position
        assert tree.parents[j] < j
        assert tree.tokens[j] in list(cand[tree.depth[j] - 1])
    assert build_tree(logq, cand, 1, rows).parents == tree.parents  # deterministic


def test_build_tree_caps_depth_and_breaks_ties_towards_the_root():
    logq = np.zeros((4, 2, 2), np.float32)  # every path of every depth scores 0
    cand = np.arange(8).reshape(4, 2) + 10
    tree = build_tree(logq, cand, 0, rows=7)
    assert tree.depth == (0, 1, 1, 2, 2, 2, 2)
    assert build_tree(logq, cand, 0, rows=7, max_depth=1).max_depth == 1
    assert build_tree(logq, cand, 0, rows=100).rows == 1 + 2 + 4 + 8 + 16  # every node there is
    with pytest.raises(ValueError, match="at least 2 rows"):
        build_tree(logq, cand, 0, rows=1)


def test_walk_descends_while_the_pick_is_a_child():
    #      0
    #    1   2        tokens: 1->7, 2->8, 3->9 (under 1), 4->5 (under 1), 5->6 (under 2)
    #   3 4   5
    tree = DraftTree([0, 7, 8, 9, 5, 6], [-1, 0, 0, 1, 1, 2])
    picks = [7, 5, 6, 11, 12, 13]
    assert tree.walk(picks) == ([0, 1, 4], 12)
    assert tree.walk([8, 0, 6, 0, 0, 14]) == ([0, 2, 5], 14)  # a leaf always stops
    assert tree.walk([3, 0, 0, 0, 0, 0]) == ([0], 3)
    with pytest.raises(ValueError):
        DraftTree([0, 7, 7], [-1, 0, 0])  # siblings with one token


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_lattice_rows_are_log_probabilities(kind):
    target, _, drafter = load_pair_for("qwen3", kind)
    logits = mx.random.normal((5, target.vocab_size), key=mx.random.key(0))
    hidden = mx.random.normal((5, drafter.config.hidden_size), key=mx.random.key(1))
    pair = Pair.make(target, drafter)
    logq, cand = lattice_logprobs(drafter, logits, hidden, 3, 0.0, pair.selector_transform)
    T, K, _ = logq.shape
    assert T == 5 and cand.shape == (T, K)
    total = np.exp(np.array(logq)).sum(-1)
    if kind == "dflash2":
        np.testing.assert_allclose(total, 1.0, rtol=1e-5)  # over the K candidates
    else:  # the top-K share of the full vocabulary, the same for every predecessor
        assert (total <= 1 + 1e-5).all() and np.ptp(np.array(logq), axis=1).max() == 0
        assert (np.array(cand)[:, 0] == np.array(mx.argmax(logits, axis=-1))).all()


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_every_node_is_bitwise_its_path_stepped_and_commit_writes_it(family):
    """Context longer than the sliding window (the ring has wrapped)."""
    target, _, drafter = load_pair_for(family, "dflash2")
    rng = np.random.RandomState(4)
    prompt = rng.randint(2, 300, 30).tolist()
    parents = [-1, 0, 0, 1, 1, 3, 2, 5, 0]
    tokens = rng.randint(2, 300, len(parents))
    tokens[2], tokens[8] = tokens[1] + 1, tokens[1] + 2  # siblings differ
    tree = DraftTree(tokens.tolist(), parents)
    cache = target.make_cache()
    target(mx.array([prompt]), cache)
    ids = Pair.make(target, drafter).layer_ids
    views = tree_views(cache, tree)
    logits, features = tree_forward(target, tree, views, ids)
    assert features.shape[0] == tree.rows
    for node in range(tree.rows):
        step = target.make_cache()
        target(mx.array([prompt]), step)
        for n in tree.path(node):
            ref, feat = target(mx.array([[tree.tokens[n]]]), step, ids)
        assert np.array_equal(np.array(ref[0, -1]), np.array(logits[node])), f"node {node}"
        assert np.array_equal(np.array(feat[0, -1]), np.array(features[node]))
    # Writing the path 0-1-3-5-7 into place leaves the cache as stepping it did.
    path = [tree.tokens[n] for n in tree.path(7)]
    commit(cache, views, tree.path(7))
    assert cache[0].offset == len(prompt) + len(path)
    nxt, _ = target(mx.array([[11]]), cache)
    seq = target.make_cache()
    target(mx.array([prompt]), seq)
    for t in path + [11]:
        ref, _ = target(mx.array([[t]]), seq)
    assert np.array_equal(np.array(ref[0, -1]), np.array(nxt[0, -1]))


def test_hybrid_target_falls_back_to_the_chain_with_one_line():
    from test_hybrid_targets import drafter as hybrid_drafter, load

    target = load("qwen3_5")
    d = hybrid_drafter("qwen3_5", "dflash2")
    prompt = [5, 9, 13]
    with pytest.warns(UserWarning, match="recurrent") as record:
        tree = list(decode_steps(prompt, Pair.make(target, d),
                                 DecodeRequest(max_tokens=12, block_size=None, tree_rows=8)))
    assert len(record) == 1 and "\n" not in str(record[0].message)
    chain = list(decode_steps(prompt, Pair.make(target, d), DecodeRequest(max_tokens=12, block_size=None)))
    assert [s.tokens for s in tree] == [s.tokens for s in chain]


def test_tree_decoding_continues_a_prompt_cache_and_stops_at_max_tokens():
    target, _, drafter = load_pair_for("qwen3", "dflash2")
    pair = Pair.make(target, drafter)
    prompt = [17, 42, 99, 7]
    reference = ar_tokens(target, prompt, 30)
    for n in (1, 2, 3, 17):
        out = [t for s in decode_steps(prompt, pair, DecodeRequest(max_tokens=n, block_size=None, tree_rows=8))
               for t in s.tokens]
        assert out == reference[:n]
    cache = DecodeCache(target.make_cache(), drafter.make_cache())
    request = DecodeRequest(max_tokens=10, block_size=None, tree_rows=8)
    first = [t for s in decode_steps(prompt, pair, request, prompt_cache=cache) for t in s.tokens]
    more = [first[-1], 5, 6]
    second = [t for s in decode_steps(more, pair, request, prompt_cache=cache) for t in s.tokens]
    assert second == ar_tokens(target, prompt + first + [5, 6], 10)


def test_a_sampled_spine_comes_first_and_records_what_it_was_drawn_from():
    logq, cand = _lattice(T=3, K=3)
    tree = build_tree(logq, cand, 1, rows=7, spine=[2, 0, 1])
    ranks = node_ranks(tree, cand)
    assert tuple(ranks[1:4]) == (2, 0, 1) and tree.parents[1:4] == (0, 1, 2)
    assert sorted(tree.proposals) == [0, 1, 2]
    for parent, (child, tokens, q) in tree.proposals.items():
        d = tree.depth[child] - 1
        row = logq[d, ranks[parent] if parent else 0]
        assert tokens == cand[d].tolist() and np.allclose(q, np.exp(row), atol=1e-6)
    # The other three rows: the best nodes off the spine, still a prefix tree.
    rest = _rank_paths(tree, cand) - {(2,), (2, 0), (2, 0, 1)}
    candidates = _brute_force(logq, cand, 10 ** 3)
    ranked = sorted((p for p in candidates if p not in {(2,), (2, 0), (2, 0, 1)}),
                    key=lambda r: (-(logq[0, 0, r[0]] + sum(logq[t, r[t - 1], r[t]] for t in range(1, len(r)))), len(r), r))
    assert rest == set(ranked[:3])
