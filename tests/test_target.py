"""The target adapter reproduces mlx-lm's forward exactly and taps the right layers."""

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.errors import UnsupportedModelError
from dflash2_mlx.loading.checkpoints import load_target
from dflash2_mlx.engine.target.adapter import Target, check_supported
from helpers import FAMILIES, target_folder


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [True, False])
def test_logits_equal_model_call_with_cache(family, tie):
    target, _ = load_target(str(target_folder(family, tie=tie)))
    ids = mx.array([[3, 14, 15, 92, 65, 35, 89, 79]])
    ref_cache, cache = target.make_cache(), target.make_cache()
    for chunk in (ids[:, :5], ids[:, 5:6], ids[:, 6:]):
        ref = target.model(chunk, cache=ref_cache)
        logits, feats = target(chunk, cache, [0, 2])
        assert np.array_equal(np.array(ref), np.array(logits))
        assert feats.shape == (1, chunk.shape[1], 2 * target.hidden_size)


def test_features_are_layer_outputs():
    """Tapping the last layer and applying norm + head must give the logits:
    the tap is the *output* of layer id (HF hidden_states[id + 1])."""
    target, _ = load_target(str(target_folder("qwen3")))
    n = target.num_layers
    ids = mx.array([[1, 2, 3, 4]])
    logits, feats = target(ids, target.make_cache(), [n - 1])
    again = target.lm_head(target.model.model.norm(feats))
    assert np.array_equal(np.array(logits), np.array(again))
    _, earlier = target(ids, target.make_cache(), [n - 2])
    assert not np.allclose(np.array(earlier), np.array(feats))


def test_last_logits_only():
    target, _ = load_target(str(target_folder("qwen3")))
    ids = mx.array([[7, 8, 9]])
    all_rows, _ = target(ids, target.make_cache())
    last, _ = target(ids, target.make_cache(), last_logits_only=True)
    assert np.array_equal(np.array(all_rows[:, -1:]), np.array(last))


@pytest.mark.parametrize("model_type", ["gemma2", "jamba", "mamba", "gpt2"])
def test_other_families_refused_by_name(model_type):
    with pytest.raises(UnsupportedModelError, match=model_type):
        check_supported(model_type)


def test_sliding_window_llama_gets_rollback_caches():
    """Sliding layers (refused before rollback-safe caches existed) get a
    `WindowKVCache` with room for one block; full layers keep `KVCache`."""
    from mlx_lm.models import llama
    from dflash2_mlx.engine.kv_buckets import BucketedKVCache

    from dflash2_mlx.engine.target.caches import WindowKVCache

    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                           num_attention_heads=2, rms_norm_eps=1e-6, vocab_size=50,
                           layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    sliding, full = Target(llama.Model(args), max_block=4).make_cache()
    assert isinstance(sliding, WindowKVCache) and sliding.capacity == 12
    assert type(full) is BucketedKVCache  # full attention: shapes in buckets (kv_buckets.py)
