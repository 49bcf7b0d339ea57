"""Drafter config keys read the way transformers' Qwen3Config and Qwen3 attention
read them (use_sliding_window, sliding_window, max_window_layers, hidden_act,
attention_bias), or refused by name. Expectations are written from
transformers' rules and formulas here, not read back from the code under test."""

import math

import mlx.core as mx
import numpy as np
import pytest

from conftest import released_config
from dflash2_mlx.engine.drafter.config import DrafterConfig
from dflash2_mlx.engine.drafter.model import Drafter, DrafterMLP
from dflash2_mlx.errors import ConfigError
from dflash2_mlx.loading.checkpoints import load_drafter
from dflash2_mlx.tools.synthetic import drafter_config_dict, write_drafter
from helpers import target_config


def _tiny(**changes) -> dict:
    raw = released_config("dflash2")
    raw.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, vocab_size=300)
    raw["dflash_config"] = dict(raw["dflash_config"], selector_rank=8)
    raw.update(changes)
    return raw


def _windows(raw) -> list:
    return [layer.self_attn.sliding_window for layer in Drafter(DrafterConfig.from_dict(raw)).layers]


def test_use_sliding_window_absent_means_no_window():
    # transformers: use_sliding_window defaults to False and then sliding_window = None,
    # so sliding_attention layers attend to the whole context.
    raw = _tiny(sliding_window=12)
    del raw["use_sliding_window"]
    assert _windows(raw) == [None] * 5
    assert _windows(_tiny(sliding_window=12, use_sliding_window=False)) == [None] * 5
    assert _windows(_tiny(sliding_window=12, use_sliding_window=True)) == [12] * 5


def test_sliding_window_absent_is_4096():
    raw = _tiny(use_sliding_window=True)
    del raw["sliding_window"]
    assert _windows(raw) == [4096] * 5


def test_max_window_layers_builds_layer_types_when_absent():
    # transformers: layer i slides iff a window exists and i >= max_window_layers.
    raw = _tiny(num_hidden_layers=4, use_sliding_window=True, sliding_window=12, max_window_layers=2)
    del raw["layer_types"]
    assert DrafterConfig.from_dict(raw).layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert _windows(raw) == [None, None, 12, 12]
    raw["use_sliding_window"] = False  # no window: every layer is full attention
    assert DrafterConfig.from_dict(raw).layer_types == ["full_attention"] * 4
    raw.update(use_sliding_window=True)
    del raw["max_window_layers"]  # transformers' default 28: a 4-layer drafter has no sliding layer
    assert _windows(raw) == [None] * 4


_FORMULAS = {  # transformers' activations, written out in float64
    "silu": lambda x: x / (1 + np.exp(-x)),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_fast": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * x * (1 + 0.044715 * x * x))),
    "quick_gelu": lambda x: x / (1 + np.exp(-1.702 * x)),
    "relu": lambda x: np.maximum(x, 0),
}


@pytest.mark.parametrize("name", sorted(_FORMULAS))
def test_hidden_act_is_the_named_function(name):
    assert DrafterConfig.from_dict(_tiny(hidden_act=name)).hidden_act == name
    mx.random.seed(0)
    mlp = DrafterMLP(16, 32, name)
    x = mx.random.normal((3, 16))
    got = np.array(mlp(x), np.float64)
    W = {k: np.array(v, np.float64) for k, v in
         (("gate", mlp.gate_proj.weight), ("up", mlp.up_proj.weight), ("down", mlp.down_proj.weight))}
    xs = np.array(x, np.float64)
    want = (_FORMULAS[name](xs @ W["gate"].T) * (xs @ W["up"].T)) @ W["down"].T
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_unsupported_hidden_act_is_refused_by_name():
    with pytest.raises(ConfigError, match="hidden_act 'mish' is not supported"):
        DrafterConfig.from_dict(_tiny(hidden_act="mish"))


def test_is_causal_true_is_refused_by_name():
    with pytest.raises(ConfigError, match="is_causal"):
        DrafterConfig.from_dict(_tiny(is_causal=True))


def test_attention_bias_covers_o_proj_and_loads(tmp_path):
    cfg = drafter_config_dict(target_config(), "dflash", num_layers=1)
    cfg["attention_bias"] = True
    folder = write_drafter(tmp_path / "biased", cfg, seed=3)
    drafter = load_drafter(str(folder), activation_dtype=mx.float32)
    attn = drafter.layers[0].self_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
        assert "bias" in proj
    # The o_proj bias is added to every block row's attention output, as in nn.Linear.
    rng = np.random.default_rng(0)
    x = mx.array(rng.normal(size=(1, 4, cfg["hidden_size"])).astype(np.float32))
    ctx = mx.array(rng.normal(size=(1, 6, cfg["hidden_size"])).astype(np.float32))

    from dflash2_mlx.engine.drafter.model import CachedContext
    from mlx_lm.models.cache import KVCache

    bias = mx.array(rng.normal(size=(cfg["hidden_size"],)).astype(np.float32))
    attn.o_proj.bias = mx.zeros_like(bias)
    without = attn(x, CachedContext(ctx, KVCache()))
    attn.o_proj.bias = bias
    with_bias = attn(x, CachedContext(ctx, KVCache()))
    assert np.allclose(np.array(with_bias - without), np.broadcast_to(np.array(bias), (1, 4, bias.size)), atol=1e-5)
