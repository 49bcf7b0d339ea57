"""Sliding-window drafter layers follow the per-query rule of the published
references (z-lab dflash `_attention_mask`, NeMo `_sliding_window_mask`, the
training masks): block row i, at position p + i, sees the key at position k
iff |p + i - k| < W.

The expected visibility is written out here by hand and observed from outside:
a one-layer DFlash (v1) drafter's block row i changes when context row j is
perturbed iff it sees row j (v1 has no conv, so rows do not mix otherwise).
"""

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter
from dflash2_mlx.train.packing import PackedContext
from helpers import target_config

W, P = 12, 40  # a W = 12 drafter over a 40-token context


def _drafter(block_size=8, use_sliding_window=True, kind="dflash", layers=1):
    cfg = drafter_config_dict(target_config(), kind, num_layers=layers, block_size=block_size, sliding=True)
    cfg.update(sliding_window=W, use_sliding_window=use_sliding_window)
    return random_drafter(cfg, seed=11)


def _inputs(drafter, B, P=P, seed=0):
    rng = np.random.default_rng(seed)
    block = mx.array(rng.normal(size=(1, B, drafter.config.hidden_size)).astype(np.float32))
    feats = mx.array(rng.normal(size=(1, P, drafter.fc.weight.shape[1])).astype(np.float32))
    return block, feats


def _bump(x, j, axis=1):
    """x with row j along `axis` moved far away."""
    onehot = (mx.arange(x.shape[axis]) == j).astype(x.dtype)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return x + 3.0 * onehot.reshape(shape)


def _rows_changed(a, b) -> list[bool]:
    a, b = np.array(a, np.float64)[0], np.array(b, np.float64)[0]
    return [not np.allclose(a[i], b[i], rtol=0, atol=1e-6) for i in range(a.shape[0])]


def _seen_context(run, B) -> list[set]:
    """For each block row, the context rows whose perturbation changes it."""
    base = run(None)
    seen = [set() for _ in range(B)]
    for j in range(P):
        for i, changed in enumerate(_rows_changed(base, run(j))):
            if changed:
                seen[i].add(j)
    return seen


def _per_query_context(B) -> list[set]:
    # By hand: the anchor sits at position P, row i at P + i; keys at k with P + i - k < W.
    return [{k for k in range(P) if (P + i) - k < W} for i in range(B)]


@pytest.mark.parametrize("chunks", [(P,), (20, 13, 7)], ids=["one-pass", "prefill-chunks-then-pending"])
def test_decode_row_i_sees_i_fewer_context_rows(chunks):
    B = 8
    drafter = _drafter(B)
    block, feats = _inputs(drafter, B)

    def run(j):
        f = feats if j is None else _bump(feats, j)
        cache, start = drafter.make_cache(), 0
        for n in chunks[:-1]:  # prefill chunks go straight into the cache
            drafter.append_context(f[:, start : start + n], cache)
            start += n
        return drafter(block, f[:, start:], cache)

    seen = _seen_context(run, B)
    want = _per_query_context(B)
    assert want[0] == set(range(29, 40)) and want[7] == set(range(36, 40))  # the rule, spelled out
    assert seen == want


def test_decode_block_rows_beyond_the_window_do_not_see_each_other():
    # B = 16 > W = 12: rows 11.. see no context, and block rows more than W - 1 apart are masked too.
    B = 16
    drafter = _drafter(B)
    block, feats = _inputs(drafter, B)
    assert _seen_context(lambda j: drafter(block, feats if j is None else _bump(feats, j),
                                           drafter.make_cache()), B) == _per_query_context(B)
    base = drafter(block, feats, drafter.make_cache())
    for j in range(B):
        changed = _rows_changed(base, drafter(_bump(block, j), feats, drafter.make_cache()))
        assert changed == [abs(i - j) < W for i in range(B)], j


def test_use_sliding_window_false_attends_to_the_whole_context():
    B = 8
    drafter = _drafter(B, use_sliding_window=False)
    assert all(layer.self_attn.sliding_window is None for layer in drafter.layers)
    block, feats = _inputs(drafter, B)
    seen = _seen_context(lambda j: drafter(block, feats if j is None else _bump(feats, j),
                                           drafter.make_cache()), B)
    assert seen == [set(range(P))] * B


def test_training_mask_obeys_the_same_rule():
    # Two sequences, three blocks with different anchors, through PackedContext.
    B, L = 8, 48
    drafter = _drafter(B)
    rng = np.random.default_rng(1)
    feats = mx.array(rng.normal(size=(2, L, drafter.fc.weight.shape[1])).astype(np.float32))
    seq, anchors = mx.array([0, 0, 1]), mx.array([9, 40, 30])
    block = mx.array(rng.normal(size=(3, B, drafter.config.hidden_size)).astype(np.float32))
    layer = drafter.layers[0]

    def run(s, j):
        f = feats if j is None else mx.concatenate(
            [_bump(feats[s : s + 1], j), feats[s + 1 :]] if s == 0 else [feats[:1], _bump(feats[1:], j)])
        return layer(block, PackedContext(drafter.project_context(f), seq, anchors, B))

    for b, (s, p) in enumerate(zip(seq.tolist(), anchors.tolist())):
        base = run(s, None)
        seen = [set() for _ in range(B)]
        for j in range(L):
            changed = _rows_changed(base[b : b + 1], run(s, j)[b : b + 1])
            for i in range(B):
                if changed[i]:
                    seen[i].add(j)
        # By hand: strictly before the anchor, and within W of the row's own position p + i.
        want = [{k for k in range(L) if k < p and (p + i) - k < W} for i in range(B)]
        assert seen == want, (b, p)


def test_training_and_decode_agree_past_the_window():
    # The same block over the same 40 rows, as a packed training block and as a decode step.
    B = 8
    drafter = _drafter(B, kind="dflash2", layers=2)
    block, feats = _inputs(drafter, B)
    decoded = drafter(block, feats, drafter.make_cache())
    h = block
    ctx = PackedContext(drafter.project_context(feats), mx.array([0]), mx.array([P]), B)
    for layer in drafter.layers:
        h = layer(h, ctx)
    assert np.allclose(np.array(decoded), np.array(drafter.norm(h)), rtol=0, atol=1e-5)
