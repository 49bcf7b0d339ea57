"""DrafterConfig reads both released formats and refuses what it cannot run (docs/algorithm.md §1–§3)."""

import copy

import pytest

from conftest import released_config
from dflash2_mlx.engine.drafter.config import DrafterConfig, default_target_layer_ids
from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.errors import ConfigError, DFlashError

# -- the default layer-id formula ------------------------------------------------


@pytest.mark.parametrize(
    "n_target, n_draft, expected",
    [
        (36, 5, [1, 9, 17, 25, 33]),  # Qwen3-4B, docs/algorithm.md §1
        (52, 5, [1, 13, 25, 37, 49]),  # Muse Glimmer's listed ids (checked against the fixture below)
        # By hand: span = n_target - 4, step = span / (n_draft - 1), ids = round(1 + i*step).
        (28, 5, [1, 7, 13, 19, 25]),  # span 24, step 6
        (36, 3, [1, 17, 33]),  # span 32, step 16
        (32, 4, [1, 10, 20, 29]),  # span 28, step 9.33: 1, 10.33, 19.67, 29
        (10, 4, [1, 3, 5, 7]),  # span 6, step 2
        (40, 2, [1, 37]),  # span 36: first tap 1, last tap n - 3
        (64, 5, [1, 16, 31, 46, 61]),  # span 60, step 15
    ],
)
def test_default_layer_ids(n_target, n_draft, expected):
    assert default_target_layer_ids(n_target, n_draft) == expected


@pytest.mark.parametrize("n_target", [4, 7, 28, 36, 52, 61])
def test_default_layer_ids_single_draft_layer_is_middle(n_target):
    assert default_target_layer_ids(n_target, 1) == [n_target // 2]


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_released_ids_follow_the_default_formula(kind):
    """Both released drafters list exactly the ids the formula gives for their target."""
    raw = released_config(kind)
    ids = raw["dflash_config"]["target_layer_ids"]
    assert default_target_layer_ids(raw["num_target_layers"], raw["num_hidden_layers"]) == ids


def test_absent_ids_default_from_num_target_layers():
    raw = released_config("dflash")
    del raw["dflash_config"]["target_layer_ids"]
    raw["num_target_layers"] = 28
    assert DrafterConfig.from_dict(raw).target_layer_ids == [1, 7, 13, 19, 25]


def test_absent_ids_and_layer_count_resolve_against_the_target():
    raw = released_config("dflash")
    del raw["dflash_config"]["target_layer_ids"]
    del raw["num_target_layers"]
    c = DrafterConfig.from_dict(raw)
    assert c.target_layer_ids is None
    assert c.resolve_layer_ids(36) == [1, 9, 17, 25, 33]
    assert c.resolve_layer_ids(28) == [1, 7, 13, 19, 25]
    raw["num_hidden_layers"] = 1
    raw["layer_types"] = ["full_attention"]
    assert DrafterConfig.from_dict(raw).resolve_layer_ids(36) == [18]


def test_listed_ids_win_over_the_formula():
    raw = released_config("dflash")
    raw["dflash_config"]["target_layer_ids"] = [2, 3, 5, 7, 11]
    c = DrafterConfig.from_dict(raw)
    assert c.target_layer_ids == [2, 3, 5, 7, 11]
    assert c.resolve_layer_ids(36) == [2, 3, 5, 7, 11]


# -- the released configs ------------------------------------------------------


def test_dflash_v1_fixture_parses():
    raw = released_config("dflash")
    c = DrafterConfig.from_dict(raw)
    assert c.kind == "dflash" and not c.is_dflash2
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size",
                "max_position_embeddings", "num_target_layers", "block_size", "layer_types"):
        assert getattr(c, key) == raw[key], key
    assert c.rope_theta == raw["rope_theta"]
    assert c.rope_scaling is None
    assert c.block_size == raw["block_size"]  # top level in this revision
    assert c.target_layer_ids == raw["dflash_config"]["target_layer_ids"]
    assert c.mask_token_id == raw["dflash_config"]["mask_token_id"]
    assert c.sliding_window is None
    assert c.layer_types == ["full_attention"] * raw["num_hidden_layers"]
    # v1 has no DFlash 2 extras: the defaults are the transparent ones.
    assert c.output_multiplier == 1.0 and c.final_logit_softcapping is None


def test_dflash2_fixture_parses():
    raw = released_config("dflash2")
    nested = raw["dflash_config"]
    c = DrafterConfig.from_dict(raw)
    assert c.kind == "dflash2" and c.is_dflash2
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "sliding_window",
                "max_position_embeddings", "num_target_layers", "layer_types"):
        assert getattr(c, key) == raw[key], key
    for key in ("block_size", "target_layer_ids", "mask_token_id", "conv_group_size",
                "conv_kernel_size", "selector_rank", "selector_top_k", "output_multiplier",
                "final_logit_softcapping"):
        assert getattr(c, key) == nested[key], key
    assert c.rope_theta == raw["rope_parameters"]["rope_theta"]
    assert c.rope_scaling is None  # rope_type "default"
    assert c.hidden_size // c.conv_group_size == raw["hidden_size"] // nested["conv_group_size"]
    assert set(c.layer_types) == {"sliding_attention"}


def test_fixture_configs_are_not_modified_by_parsing():
    raw = released_config("dflash2")
    before = copy.deepcopy(raw)
    DrafterConfig.from_dict(raw)
    assert raw == before


# -- nested or flat --------------------------------------------------------------

NESTABLE = {
    "block_size": (8, 12),
    "target_layer_ids": ([1, 9, 17, 25, 33], [2, 10, 18, 26, 34]),
    "mask_token_id": (151669, 151670),
    "num_target_layers": (36, 40),
}


def _v1_without(*keys) -> dict:
    raw = released_config("dflash")
    for key in keys:
        raw.pop(key, None)
        raw["dflash_config"].pop(key, None)
    return raw


@pytest.mark.parametrize("key", sorted(NESTABLE))
@pytest.mark.parametrize("where", ["top", "nested"])
def test_key_read_flat_or_nested(key, where):
    value = NESTABLE[key][0]
    raw = _v1_without(key)
    (raw if where == "top" else raw["dflash_config"])[key] = value
    assert getattr(DrafterConfig.from_dict(raw), key) == value


@pytest.mark.parametrize("key", sorted(NESTABLE))
def test_nested_wins_over_top_level(key):
    top, nested = NESTABLE[key]
    raw = _v1_without(key)
    raw[key] = top
    raw["dflash_config"][key] = nested
    assert getattr(DrafterConfig.from_dict(raw), key) == nested


def test_block_size_defaults_to_16_when_absent():
    assert DrafterConfig.from_dict(_v1_without("block_size")).block_size == 16


DFLASH2_KEYS = {
    "conv_group_size": 32,
    "conv_kernel_size": 2,
    "selector_rank": 128,
    "selector_top_k": 8,
    "output_multiplier": 0.5,
    "final_logit_softcapping": 30.0,
}


@pytest.mark.parametrize("where", ["top", "nested"])
def test_dflash2_keys_flat_or_nested(where):
    raw = released_config("dflash2")
    for key in DFLASH2_KEYS:
        raw["dflash_config"].pop(key, None)
    (raw if where == "top" else raw["dflash_config"]).update(DFLASH2_KEYS)
    c = DrafterConfig.from_dict(raw)
    for key, value in DFLASH2_KEYS.items():
        assert getattr(c, key) == value, key
    assert c.hidden_size // c.conv_group_size == raw["hidden_size"] // 32


def test_dflash2_optional_keys_default():
    raw = released_config("dflash2")
    del raw["dflash_config"]["output_multiplier"]
    del raw["dflash_config"]["final_logit_softcapping"]
    c = DrafterConfig.from_dict(raw)
    assert c.output_multiplier == 1.0
    assert c.final_logit_softcapping is None


# -- RoPE and attention layout ---------------------------------------------------


def _tiny(raw: dict, **changes) -> dict:
    """`raw` with sizes small enough to build a Drafter in a few ms."""
    raw = copy.deepcopy(raw)
    raw.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, vocab_size=256)
    raw["dflash_config"]["selector_rank"] = 32
    raw.update(changes)
    return raw


def test_rope_theta_top_level_reaches_the_drafter():
    raw = _tiny(released_config("dflash"))
    d = Drafter(DrafterConfig.from_dict(raw))
    assert d.layers[0].self_attn.rope.base == raw["rope_theta"]


def test_rope_parameters_nested_reach_the_drafter():
    raw = _tiny(released_config("dflash2"))
    assert "rope_theta" not in raw
    c = DrafterConfig.from_dict(raw)
    assert c.rope_theta == raw["rope_parameters"]["rope_theta"]
    assert Drafter(c).layers[0].self_attn.rope.base == raw["rope_parameters"]["rope_theta"]


def test_rope_defaults_when_absent():
    raw = released_config("dflash")
    del raw["rope_theta"]
    assert DrafterConfig.from_dict(raw).rope_theta == 1_000_000.0


def test_nested_rope_scaling_is_kept():
    raw = released_config("dflash2")
    raw["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 250000.0}
    c = DrafterConfig.from_dict(raw)
    assert c.rope_theta == 250000.0
    assert c.rope_scaling["rope_type"] == "linear" and c.rope_scaling["factor"] == 2.0


def test_sliding_window_reaches_sliding_layers_only():
    raw = _tiny(released_config("dflash2"), num_hidden_layers=3, sliding_window=6,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    d = Drafter(DrafterConfig.from_dict(raw))
    assert [layer.self_attn.sliding_window for layer in d.layers] == [6, None, 6]


def test_released_dflash2_layers_are_all_sliding():
    raw = _tiny(released_config("dflash2"))
    d = Drafter(DrafterConfig.from_dict(raw))
    assert [layer.self_attn.sliding_window for layer in d.layers] == [raw["sliding_window"]] * 5


def test_layer_types_default_to_full_attention():
    raw = released_config("dflash")
    del raw["layer_types"]
    assert DrafterConfig.from_dict(raw).layer_types == ["full_attention"] * raw["num_hidden_layers"]


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"sliding_window": None}, "sliding_window"),
        ({"layer_types": ["sliding_attention"] * 4}, "layer_types has 4 entries for 5 layers"),
        ({"layer_types": ["chunked_attention"] * 5}, "chunked_attention"),
    ],
)
def test_bad_layer_layout_refused(change, fragment):
    raw = released_config("dflash2")
    raw.update(change)
    with pytest.raises(ConfigError, match=fragment):
        DrafterConfig.from_dict(raw)


# -- refusals that name the key ------------------------------------------------------


@pytest.mark.parametrize("where", ["top", "nested"])
@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("projector_type", "mlp", "projector_type 'mlp'"),
        ("partial_rotary_factor", 0.5, "partial_rotary_factor 0.5"),
        ("attention_sink_bias", True, "attention_sink_bias"),
    ],
)
def test_unimplemented_variants_refused(where, key, value, fragment):
    raw = released_config("dflash2")
    (raw if where == "top" else raw["dflash_config"])[key] = value
    with pytest.raises(ConfigError, match=fragment) as e:
        DrafterConfig.from_dict(raw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "key, value", [("projector_type", "linear"), ("partial_rotary_factor", 1.0),
                   ("attention_sink_bias", False)],
)
def test_plain_variants_accepted(key, value):
    raw = released_config("dflash2")
    raw["dflash_config"][key] = value
    assert DrafterConfig.from_dict(raw).is_dflash2


@pytest.mark.parametrize("arch", [["Qwen3ForCausalLM"], ["EagleDraftModel"]])
def test_non_dflash_architecture_refused(arch):
    raw = released_config("dflash")
    raw["architectures"] = arch
    with pytest.raises(ConfigError, match=arch[0]):
        DrafterConfig.from_dict(raw)


def test_missing_architectures_means_dflash_v1():
    raw = released_config("dflash")
    del raw["architectures"]
    assert DrafterConfig.from_dict(raw).kind == "dflash"


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size", "num_hidden_layers"])
def test_missing_required_key_named(key):
    raw = released_config("dflash")
    del raw[key]
    with pytest.raises(ConfigError, match=key):
        DrafterConfig.from_dict(raw)


@pytest.mark.parametrize(
    "nested, fragment",
    [
        ({"conv_kernel_size": 3}, "conv_kernel_size 3"),
        ({"conv_group_size": 100}, "conv_group_size 100"),
        ({"block_size": 1}, "block_size 1"),
    ],
)
def test_bad_dflash2_values_refused(nested, fragment):
    raw = released_config("dflash2")
    raw["dflash_config"].update(nested)
    with pytest.raises(ConfigError, match=fragment):
        DrafterConfig.from_dict(raw)


def test_config_errors_are_dflash_errors():
    assert issubclass(ConfigError, DFlashError)
