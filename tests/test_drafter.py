"""Drafter invariants: identity-initialised DFlash 2 == DFlash, a block-local
conv, and a context cache that changes nothing but cost."""

import mlx.core as mx
import numpy as np

from dflash2_mlx.engine.pair import declared_transform
from dflash2_mlx.engine.drafter.config import DrafterConfig
from dflash2_mlx.engine.drafter.conv import two_tap_conv_ops
from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.engine.drafter.propose import propose
from dflash2_mlx.engine.sampling import SamplingParams, make_logprobs_transform
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter
from helpers import load_pair_for, target_config

H = 64


def _inputs(seed=0, B=6, P=9, taps=2):
    rng = np.random.default_rng(seed)
    block = mx.array(rng.normal(size=(1, B, H)).astype(np.float32))
    feats = mx.array(rng.normal(size=(1, P, taps * H)).astype(np.float32))
    return block, feats


def test_identity_dflash2_equals_dflash():
    cfg2 = drafter_config_dict(target_config(), "dflash2")
    cfg1 = drafter_config_dict(target_config(), "dflash")
    v2 = random_drafter(cfg2, seed=3, trained_extras=False)  # conv identity, successor codebook zero
    v1 = Drafter(DrafterConfig.from_dict(cfg1), fc_in_features=v2.fc.weight.shape[1])
    shared = {k: v for k, v in v2.parameters().items() if k != "candidate_selector"}
    shared["layers"] = [
        {k: v for k, v in layer.items() if not k.endswith("_conv")} for layer in shared["layers"]
    ]
    v1.update(shared)
    block, feats = _inputs()
    h1 = v1(block, feats, v1.make_cache())
    h2 = v2(block, feats, v2.make_cache())
    assert np.array_equal(np.array(h1), np.array(h2))

    # And the greedy walk over an untrained selector picks the drafter's argmax.
    target, _, _ = load_pair_for("qwen3", "dflash2")
    logits = target.lm_head(h2[0, 1:])
    transform = make_logprobs_transform(SamplingParams())
    p2 = propose(v2, logits, h2[0, 1:], 5, SamplingParams(), transform, mx.random.key(0), declared_transform(v2))
    p1 = propose(v1, logits, h1[0, 1:], 5, SamplingParams(), transform, mx.random.key(0), declared_transform(v1))
    assert p1.draft.tolist() == p2.draft.tolist() == mx.argmax(logits, -1).tolist()


def test_conv_is_block_local():
    rng = np.random.default_rng(0)
    N, B, G = 3, 5, H // 16
    x = rng.normal(size=(N, B, H)).astype(np.float32)
    d = rng.normal(size=(N, B, 2, G)).astype(np.float32)
    base = rng.normal(size=(2, H)).astype(np.float32)
    y = np.array(two_tap_conv_ops(mx.array(x), mx.array(d), mx.array(base), 16))
    # Reference: y[t] = coef0 * x[t] + coef1 * x[t-1], x[-1] = 0 inside each block.
    coef = base[None, None] + np.repeat(d, 16, axis=-1)
    prev = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
    assert np.allclose(y, coef[:, :, 0] * x + coef[:, :, 1] * prev, atol=1e-5)
    # Changing the last row of block 0 must not touch block 1 (no cross-block reads).
    x2 = x.copy()
    x2[0, -1] += 100.0
    y2 = np.array(two_tap_conv_ops(mx.array(x2), mx.array(d), mx.array(base), 16))
    assert np.array_equal(y2[1:], y[1:]) and np.array_equal(y2[0, :-1], y[0, :-1])


def test_block_row_zero_ignores_context_in_conv():
    """Context rows are never convolved: the anchor row reads zero for tap 1,
    so changing the context only reaches the block through attention."""
    cfg = drafter_config_dict(target_config(), "dflash2")
    drafter = random_drafter(cfg, seed=1)
    x = mx.array(np.random.default_rng(0).normal(size=(1, 4, H)).astype(np.float32))
    layer = drafter.layers[0]
    d = layer.attention_conv.corrections(x)
    out = layer.attention_conv(x, d, 0)
    coef0 = layer.attention_conv.base_kernel[0, 0] + mx.repeat(d[0, 0, 0, 0], 16)
    assert np.allclose(np.array(out[0, 0]), np.array(coef0 * x[0, 0]), atol=1e-6)


def test_cached_context_equals_recomputation():
    for kind in ("dflash", "dflash2"):
        drafter = random_drafter(drafter_config_dict(target_config(), kind), seed=2)
        block, feats = _inputs(P=12)
        once = drafter(block, feats, drafter.make_cache())
        cache = drafter.make_cache()
        drafter.append_context(feats[:, :5], cache)  # e.g. prefill chunks
        drafter.append_context(feats[:, 5:9], cache)
        cached = drafter(block, feats[:, 9:], cache)  # pending rows enter with the block
        assert np.allclose(np.array(once), np.array(cached), atol=1e-5), kind
        assert cache[0].offset == 12  # only committed context is kept
        again = drafter(block, None, cache)  # a second block sees the same context
        assert np.allclose(np.array(once), np.array(again), atol=1e-5)
        assert cache[0].offset == 12


def test_sliding_window_layers_see_last_window_minus_one_rows():
    cfg = drafter_config_dict(target_config(), "dflash", sliding=True)  # window 8
    drafter = random_drafter(cfg, seed=4)
    block, feats = _inputs(P=20)
    full = drafter(block, feats, drafter.make_cache())
    # Only the last 7 context rows may matter: perturb the first 13.
    noisy = mx.concatenate([feats[:, :13] + 5.0, feats[:, 13:]], axis=1)
    assert np.array_equal(np.array(full), np.array(drafter(block, noisy, drafter.make_cache())))
    changed = mx.concatenate([feats[:, :13], feats[:, 13:] + 5.0], axis=1)
    assert not np.allclose(np.array(full), np.array(drafter(block, changed, drafter.make_cache())))


def test_sliding_layer_cache_is_bounded_and_exact():
    """Sliding drafter layers keep window − 1 rows (+ one block of room): same
    output as an unbounded cache, bounded memory, exact rewind within the room."""
    from mlx_lm.models.cache import KVCache

    cfg = drafter_config_dict(target_config(), "dflash2", sliding=True)  # window 8
    drafter = random_drafter(cfg, seed=5)
    block, feats = _inputs(P=40)
    bounded, unbounded = drafter.make_cache(), [KVCache() for _ in drafter.layers]
    for start in range(0, 40, 7):
        drafter.append_context(feats[:, start : start + 7], bounded)
        drafter.append_context(feats[:, start : start + 7], unbounded)
    a, b = drafter(block, None, bounded), drafter(block, None, unbounded)
    assert np.array_equal(np.array(a), np.array(b))
    assert bounded[0].keys.shape[2] <= 7 + 16 and bounded[0].offset == 40
    for c in bounded + unbounded:
        c.trim(3)
    assert np.array_equal(np.array(drafter(block, None, bounded)), np.array(drafter(block, None, unbounded)))
