"""Strict drafter loading in the released layouts, target loading, and one clear
error per broken variant (tensors named in docs/algorithm.md §1–§3)."""

import json
import math
import re
import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from conftest import TINY_TARGET, released_config, released_header, scaled_released_config
from dflash2_mlx.device import target_activation_dtype
from dflash2_mlx.engine.pair import Pair, compatibility_report
from dflash2_mlx.engine.drafter.config import DrafterConfig, default_target_layer_ids
from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.errors import (
    CheckpointError,
    ConfigError,
    DFlashError,
    IncompatibleError,
    UnsupportedModelError,
)
from dflash2_mlx.loading.checkpoints import (check_weights, has_experts, load_drafter, load_target,
                                           sanitize_drafter_weights)
from dflash2_mlx.loading.load_pair import load_pair
from dflash2_mlx.tools.synthetic import TARGET_CONFIGS, write_target
from dflash2_mlx.train.export import released_weights

WEIGHTS = "model.safetensors"


def model_name(name: str) -> str:
    """Released tensor name -> parameter name (codebooks ship without `.weight`)."""
    if name.startswith("candidate_selector.") and name.endswith("_codebook"):
        return name + ".weight"
    return name


def read_weights(folder) -> dict:
    weights = mx.load(str(folder / WEIGHTS))
    mx.eval(weights)  # read fully before the file is rewritten
    return weights


def write_weights(folder, weights: dict) -> None:
    mx.save_safetensors(str(folder / WEIGHTS), weights, metadata={"format": "mlx"})


def edit_config(folder, **changes) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if key in cfg.get("dflash_config", {}):
            cfg["dflash_config"][key] = value
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    return cfg


def write_drafter_with(folder, config: dict, fc_in_features=None, seed: int = 0):
    """A random drafter checkpoint whose fc width may differ from what config implies."""
    mx.random.seed(seed)
    drafter = Drafter(DrafterConfig.from_dict(config), fc_in_features=fc_in_features)
    folder.mkdir(parents=True)
    write_weights(folder, released_weights(drafter))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def error_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, "user-facing errors are one line"
    return message


# -- the released layouts at full size (no weights materialised) -------------------


@pytest.mark.parametrize("kind, n_tensors", [("dflash", 58), ("dflash2", 81)])
def test_full_size_drafter_matches_released_header(kind, n_tensors):
    raw, header = released_config(kind), released_header(kind)
    c = DrafterConfig.from_dict(raw)
    # fc reads n taps of the target's residual stream; the drafter's hidden size is the target's.
    drafter = Drafter(c, fc_in_features=len(c.target_layer_ids) * c.hidden_size)
    built = {name: tuple(p.shape) for name, p in tree_flatten(drafter.parameters())}
    released = {model_name(name): tuple(t["shape"]) for name, t in header.items()}
    assert len(header) == n_tensors
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    assert sorted(built) == sorted(released)
    mismatched = {n: (built[n], released[n]) for n in built if built[n] != released[n]}
    assert not mismatched
    count = sum(math.prod(s) for s in built.values())
    assert count == sum(math.prod(t["shape"]) for t in header.values())
    if kind == "dflash2":
        assert count == 2_772_159_744
    else:
        assert round(count / 1e6, 1) == 537.4


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_loader_checks_accept_released_names_and_shapes(kind, tmp_path):
    """sanitize + check_weights (what load_drafter runs) on the real header's names and
    shapes; lazy zeros stand in for the weights and are never evaluated."""
    raw, header = released_config(kind), released_header(kind)
    weights = {n: mx.zeros(t["shape"], dtype=mx.bfloat16) for n, t in header.items()}
    weights = sanitize_drafter_weights(weights, tmp_path)
    drafter = Drafter(DrafterConfig.from_dict(raw), fc_in_features=weights["fc.weight"].shape[1])
    check_weights(drafter, weights, tmp_path)
    # ...and the same check refuses one shape off by a row.
    name = "layers.4.mlp.down_proj.weight"
    rows, cols = weights[name].shape
    weights[name] = mx.zeros((rows + 1, cols), dtype=mx.bfloat16)
    with pytest.raises(CheckpointError, match=name):
        check_weights(drafter, weights, tmp_path)


# -- tiny checkpoints in the released layout load strictly and exactly ------------------


@pytest.mark.parametrize(
    "kind, codebook_suffix", [("dflash", False), ("dflash2", False), ("dflash2", True)],
    ids=["dflash", "dflash2-released-codebooks", "dflash2-codebooks-with-weight"],
)
def test_released_layout_loads_exactly(kind, codebook_suffix, drafter_ckpt):
    folder = drafter_ckpt(kind, codebook_suffix=codebook_suffix)
    cfg = json.loads((folder / "config.json").read_text())
    released = released_config(kind)
    assert set(cfg) == set(released)  # same keys, same nesting, only sizes changed
    assert set(cfg["dflash_config"]) == set(released["dflash_config"])
    written = read_weights(folder)
    names = {model_name(n) if codebook_suffix else n for n in released_header(kind)}
    assert set(written) == names
    assert {v.dtype for v in written.values()} == {mx.bfloat16}

    drafter = load_drafter(str(folder))
    assert drafter.config.kind == kind
    assert drafter.config.target_layer_ids == cfg["dflash_config"]["target_layer_ids"]
    params = dict(tree_flatten(drafter.parameters()))
    assert set(params) == {model_name(n) for n in written}
    for name, value in written.items():
        p = params[model_name(name)]
        assert p.dtype == mx.float32, name  # fp32 activations on the CPU backend
        assert mx.array_equal(p, value.astype(mx.float32)).item(), name

    bf16 = dict(tree_flatten(load_drafter(str(folder), activation_dtype=mx.bfloat16).parameters()))
    for name, value in written.items():
        assert bf16[model_name(name)].dtype == mx.bfloat16
        assert mx.array_equal(bf16[model_name(name)], value).item(), name


def test_codebook_spellings_load_the_same_drafter(drafter_ckpt):
    plain = dict(tree_flatten(load_drafter(str(drafter_ckpt("dflash2"))).parameters()))
    suffixed = dict(tree_flatten(load_drafter(str(drafter_ckpt("dflash2", codebook_suffix=True))).parameters()))
    assert plain.keys() == suffixed.keys()
    assert all(mx.array_equal(plain[k], suffixed[k]).item() for k in plain)
    # The codebooks are trained-looking (not zero), so the comparison means something.
    assert mx.abs(plain["candidate_selector.successor_codebook.weight"]).max().item() > 0


@pytest.mark.parametrize(
    "variant", ["block-nested", "block-both", "rope-nested", "no-ids", "model-prefix"]
)
def test_v1_revisions_load(variant, drafter_ckpt, scaled_config, copy_ckpt):
    cfg = scaled_config("dflash")
    top_block = cfg["block_size"]  # top level in the released revision
    if variant == "block-nested":
        del cfg["block_size"]
        cfg["dflash_config"]["block_size"] = 8
    elif variant == "block-both":
        cfg["dflash_config"]["block_size"] = 8
    elif variant == "rope-nested":
        cfg["rope_parameters"] = {"rope_theta": cfg.pop("rope_theta"), "rope_type": "default"}
    elif variant == "no-ids":
        del cfg["dflash_config"]["target_layer_ids"]
    folder = drafter_ckpt("dflash", config=cfg)
    if variant == "model-prefix":
        folder = copy_ckpt(folder)
        write_weights(folder, {"model." + k: v for k, v in read_weights(folder).items()})
    drafter = load_drafter(str(folder))
    expected = dict(read_weights(drafter_ckpt("dflash", config=cfg)))
    params = dict(tree_flatten(drafter.parameters()))
    assert all(mx.array_equal(params[k], v.astype(mx.float32)).item() for k, v in expected.items())
    c = drafter.config
    assert c.block_size == (8 if variant.startswith("block") else top_block)
    assert c.rope_theta == released_config("dflash")["rope_theta"]
    assert c.target_layer_ids == default_target_layer_ids(TINY_TARGET["num_hidden_layers"], 5)


# -- broken drafter checkpoints: one clear error each ---------------------------------


def _drop(name):
    return lambda w: w.pop(name)


def _reshape(name, shape):
    return lambda w: w.__setitem__(name, mx.zeros(shape, dtype=mx.bfloat16))


def _add(name, shape):
    return lambda w: w.__setitem__(name, mx.zeros(shape, dtype=mx.bfloat16))


BROKEN_WEIGHTS = {
    "missing-tensor": (_drop("layers.3.mlp.down_proj.weight"), CheckpointError,
                       "missing tensor 'layers.3.mlp.down_proj.weight'"),
    "missing-codebook": (_drop("candidate_selector.successor_codebook"), CheckpointError,
                         "missing tensor 'candidate_selector.successor_codebook.weight'"),
    "missing-fc": (_drop("fc.weight"), CheckpointError, "missing tensor 'fc.weight'"),
    "wrong-shape": (_reshape("layers.0.self_attn.q_norm.weight", (32,)), CheckpointError,
                    r"tensor 'layers.0.self_attn.q_norm.weight' has shape \(32,\), config.json implies \(16,\)"),
    "wrong-codebook-rank": (_reshape("candidate_selector.predecessor_codebook", (384, 16)), CheckpointError,
                            r"'candidate_selector.predecessor_codebook.weight' has shape \(384, 16\)"),
    "extra-tensor": (_add("layers.5.input_layernorm.weight", (64,)), CheckpointError,
                     "unexpected tensor 'layers.5.input_layernorm.weight'"),
    "ships-lm-head": (_add("lm_head.weight", (384, 64)), ConfigError, "ships its own 'lm_head.weight'"),
    "ships-embedding": (_add("embed_tokens.weight", (384, 64)), ConfigError,
                        "ships its own 'embed_tokens.weight'"),
    "both-codebook-spellings": (_add("candidate_selector.successor_codebook.weight", (384, 32)),
                                CheckpointError, "'candidate_selector.successor_codebook.weight' twice"),
}


@pytest.mark.parametrize("variant", sorted(BROKEN_WEIGHTS))
def test_broken_weights_refused(variant, drafter_ckpt, copy_ckpt):
    edit, error, fragment = BROKEN_WEIGHTS[variant]
    folder = copy_ckpt(drafter_ckpt("dflash2"))
    weights = read_weights(folder)
    edit(weights)
    write_weights(folder, weights)
    with pytest.raises(error, match=fragment) as e:
        load_drafter(str(folder))
    assert str(folder) in error_line(e)


def test_dflash2_weights_under_a_v1_config_refused(drafter_ckpt, scaled_config, copy_ckpt):
    folder = copy_ckpt(drafter_ckpt("dflash2"))
    (folder / "config.json").write_text(json.dumps(scaled_config("dflash")))
    with pytest.raises(CheckpointError, match="unexpected tensor 'candidate_selector.+does not match its config.json"):
        load_drafter(str(folder))


def test_v1_weights_under_a_v2_config_refused(drafter_ckpt, scaled_config, copy_ckpt):
    folder = copy_ckpt(drafter_ckpt("dflash"))
    (folder / "config.json").write_text(json.dumps(scaled_config("dflash2")))
    with pytest.raises(CheckpointError, match="missing tensor 'candidate_selector.+ and .+ more"):
        load_drafter(str(folder))


@pytest.mark.parametrize("cut", ["empty", "inside-length", "inside-header", "half", "last-byte"])
def test_truncated_safetensors_refused(cut, drafter_ckpt, copy_ckpt):
    folder = copy_ckpt(drafter_ckpt("dflash2"))
    data = (folder / WEIGHTS).read_bytes()
    keep = {"empty": 0, "inside-length": 4, "inside-header": 40, "half": len(data) // 2,
            "last-byte": len(data) - 1}[cut]
    (folder / WEIGHTS).write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match="are truncated or corrupt.*download them again") as e:
        load_drafter(str(folder))
    assert WEIGHTS in error_line(e)


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"hidden_size": 64,', "is not valid JSON"),
        ("", "is not valid JSON"),
        (b"\xff\xfe\x00garbage", "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
    ],
    ids=["cut-short", "empty", "binary", "not-an-object"],
)
def test_invalid_config_json_refused(content, fragment, drafter_ckpt, copy_ckpt):
    folder = copy_ckpt(drafter_ckpt("dflash2"))
    if isinstance(content, bytes):
        (folder / "config.json").write_bytes(content)
    else:
        (folder / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=fragment) as e:
        load_drafter(str(folder))
    assert "config.json" in error_line(e)


def test_missing_config_refused(drafter_ckpt, copy_ckpt):
    folder = copy_ckpt(drafter_ckpt("dflash2"))
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_drafter(str(folder))


def test_folder_without_safetensors_refused(drafter_ckpt, copy_ckpt):
    folder = copy_ckpt(drafter_ckpt("dflash2"))
    (folder / WEIGHTS).rename(folder / "model.bin")
    with pytest.raises(CheckpointError, match=r"has no \.safetensors weights"):
        load_drafter(str(folder))


def test_missing_local_path_refused(tmp_path):
    missing = tmp_path / "no" / "such-drafter"
    with pytest.raises(CheckpointError, match="does not exist") as e:
        load_drafter(str(missing))
    assert str(missing) in error_line(e)
    assert not missing.exists()


def test_file_instead_of_folder_refused(drafter_ckpt):
    weights = drafter_ckpt("dflash2") / WEIGHTS
    with pytest.raises(CheckpointError, match="is a file, not a model folder"):
        load_drafter(str(weights))


def test_bare_name_is_neither_folder_nor_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="neither a folder nor a Hub repo id"):
        load_drafter("no-such-drafter")


def test_target_passed_as_drafter_refused(tiny_target_dir, copy_ckpt):
    # As converted by mlx-lm from a Hub model: `architectures` names the target class.
    folder = copy_ckpt(tiny_target_dir, "hf-target")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"\['Qwen3ForCausalLM'\] is not a DFlash drafter"):
        load_drafter(str(folder))
    # Without `architectures` or `dflash_config` the config itself gives it away.
    with pytest.raises(ConfigError, match="not a DFlash drafter"):
        load_drafter(str(tiny_target_dir))


_OFFLINE_SCRIPT = """
import json
from dflash2_mlx.errors import CheckpointError
from dflash2_mlx.loading.checkpoints import load_drafter, load_target
out = {}
for what, load in (("drafter", load_drafter), ("target", load_target)):
    try:
        load("z-lab/Qwen3-4B-DFlash-b16")
        out[what] = "loaded"
    except CheckpointError as e:
        out[what] = str(e)
print(json.dumps(out))
"""


def test_hub_repo_offline_with_empty_cache(tmp_path):
    """huggingface_hub reads its environment at import, so this runs in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    run = subprocess.run([sys.executable, "-c", _OFFLINE_SCRIPT], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for what in ("drafter", "target"):
        assert out[what].startswith(f"{what} 'z-lab/Qwen3-4B-DFlash-b16' is not in the Hugging Face cache")
        assert "pass a local folder" in out[what]
    hub_cache = tmp_path / "hf-home" / "hub"
    assert not hub_cache.exists() or not any(hub_cache.rglob("*.safetensors"))


# -- the pair: each mismatch gets its own message ---------------------------------------


def test_pair_loads(tiny_target_dir, drafter_ckpt):
    for kind in ("dflash", "dflash2"):
        pair, tokenizer = load_pair(str(tiny_target_dir), str(drafter_ckpt(kind)))
        target, drafter = pair.target, pair.drafter
        assert drafter.config.kind == kind
        assert list(pair.layer_ids) == drafter.config.target_layer_ids
        assert all(check.ok for check in compatibility_report(drafter, target))
        assert tokenizer.encode("hello world")


def test_pair_without_ids_uses_default_formula(tiny_target_dir, scaled_config, tmp_path):
    cfg = scaled_config("dflash2")
    del cfg["dflash_config"]["target_layer_ids"]
    del cfg["num_target_layers"]
    folder = write_drafter_with(tmp_path / "drafter", cfg, fc_in_features=5 * cfg["hidden_size"])
    pair, _ = load_pair(str(tiny_target_dir), str(folder))
    assert pair.drafter.config.target_layer_ids is None
    assert list(pair.layer_ids) == default_target_layer_ids(TINY_TARGET["num_hidden_layers"], 5)


def _other_target(**dims) -> dict:
    return {**TINY_TARGET, **dims}


INCOMPATIBLE = {
    # variant: (kind, config maker, fc taps override, message fragment)
    "fc-width": ("dflash2", lambda: scaled_released_config("dflash2", TINY_TARGET), 4,
                 "drafter fc input width 256 vs 5 target layers × hidden 64 = 320"),
    "layer-id-beyond": ("dflash2", lambda: scaled_released_config(
        "dflash2", TINY_TARGET, {"target_layer_ids": [1, 2, 3, 4, 8]}), None,
        r"target_layer_ids \[1, 2, 3, 4, 8\] vs target with 8 layers \(ids must be < 8\)"),
    "layer-id-negative": ("dflash", lambda: scaled_released_config(
        "dflash", TINY_TARGET, {"target_layer_ids": [-1, 2, 3, 4, 5]}), None,
        r"target_layer_ids \[-1, 2, 3, 4, 5\] vs target with 8 layers"),
    "mask-beyond-embedding": ("dflash2", lambda: scaled_released_config(
        "dflash2", TINY_TARGET, {"mask_token_id": 384}), None,
        r"mask_token_id 384 vs target embedding rows 384 \(must be < 384\)"),
    "hidden-size": ("dflash2", lambda: scaled_released_config("dflash2", _other_target(hidden_size=32)), None,
                    "drafter hidden_size 32 vs target hidden_size 64: this drafter was trained for a different target"),
    "vocab-dflash2": ("dflash2", lambda: scaled_released_config("dflash2", _other_target(vocab_size=256)), None,
                      "drafter selector codebooks have 256 rows vs target vocabulary 384"),
    "vocab-dflash": ("dflash", lambda: scaled_released_config("dflash", _other_target(vocab_size=256)), None,
                     "drafter vocab_size 256 vs target vocabulary 384"),
    "num-target-layers": ("dflash", lambda: scaled_released_config(
        "dflash", TINY_TARGET, num_target_layers=12), None,
        "drafter num_target_layers 12 vs target layers 8"),
}


@pytest.mark.parametrize("variant", sorted(INCOMPATIBLE))
def test_incompatible_pair_refused(variant, tiny_target_dir, tmp_path):
    kind, make_config, taps, fragment = INCOMPATIBLE[variant]
    cfg = make_config()
    fc_in = taps * cfg["hidden_size"] if taps else None
    folder = write_drafter_with(tmp_path / "drafter", cfg, fc_in_features=fc_in)
    drafter = load_drafter(str(folder))  # each one is a well-formed checkpoint on its own
    with pytest.raises(IncompatibleError) as e:
        load_pair(str(tiny_target_dir), str(folder))
    message = error_line(e)
    assert message.startswith("incompatible pair: ")
    assert re.search(fragment, message), message
    # The same verdict, first in the list, from the checks the `doctor` report shows.
    target, _ = load_target(str(tiny_target_dir))
    failing = [c for c in compatibility_report(drafter, target) if not c.ok]
    assert failing and f"incompatible pair: {failing[0].message}" == message
    with pytest.raises(IncompatibleError):
        Pair.make(target, drafter)


def test_incompatibility_messages_are_distinct():
    fragments = [v[3] for v in INCOMPATIBLE.values()]
    assert len(set(fragments)) == len(fragments)


# -- targets -----------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(TARGET_CONFIGS))
def test_every_target_family_loads(family, tmp_path):
    folder = write_target(tmp_path / family, family, dtype=mx.bfloat16, num_hidden_layers=4)
    written = read_weights(folder)
    target, tokenizer = load_target(str(folder))
    assert target.model_type == family
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (4, 64, 384)
    experts = "moe" in family or family == "qwen3_next"  # the CPU's gather_mm runs float32 only
    expected = target_activation_dtype(mx.bfloat16, quantized=False, experts=experts)  # the file's bf16 on the CPU
    assert target.activation_dtype == expected
    params = dict(tree_flatten(target.model.parameters()))
    assert set(params) == set(written)
    for name, value in written.items():
        assert params[name].dtype == expected
        assert mx.array_equal(params[name], value.astype(expected)).item(), name
    assert has_experts(target.model) == experts
    tokens = mx.array([tokenizer.encode("def f(x):\n    return x + 1\n")])
    L = tokens.shape[1]
    logits, features = target(tokens, target.make_cache(), [1, 2])
    assert logits.shape == (1, L, 384) and logits.dtype == expected
    assert features.shape == (1, L, 2 * 64)
    assert mx.array_equal(logits, target.model(tokens)).item()


def test_target_activation_dtype_override(tiny_target_dir):
    target, _ = load_target(str(tiny_target_dir), activation_dtype=mx.bfloat16)
    assert target.activation_dtype == mx.bfloat16


def test_4bit_target_keeps_packed_weights(tmp_path):
    folder = write_target(tmp_path / "q4", "qwen3", quantize_bits=4, dtype=mx.bfloat16, num_hidden_layers=4)
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    written = read_weights(folder)
    target, tokenizer = load_target(str(folder))
    inner = target.model.model
    linears = [m for _, m in inner.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    assert linears and all(isinstance(m, nn.QuantizedLinear) and m.bits == 4 for m in linears)
    assert isinstance(inner.embed_tokens, nn.QuantizedEmbedding)
    q = inner.layers[0].self_attn.q_proj
    assert q.weight.dtype == mx.uint32
    assert mx.array_equal(q.weight, written["model.layers.0.self_attn.q_proj.weight"]).item()
    assert q.scales.dtype == mx.float32  # bf16 scales in the file, fp32 in memory
    assert target.activation_dtype == mx.float32
    tokens = mx.array([tokenizer.encode("x = 1")])
    logits, features = target(tokens, target.make_cache(), [1, 2])
    assert logits.dtype == mx.float32 and features.dtype == mx.float32
    assert mx.isfinite(logits).all().item()


def test_unsupported_target_model_type_named(tiny_target_dir, drafter_ckpt, copy_ckpt):
    folder = copy_ckpt(tiny_target_dir, "gpt2")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="target model_type 'gpt2' is not supported") as e:
        load_target(str(folder))
    assert "qwen3" in error_line(e)  # and says what is supported
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        load_pair(str(folder), str(drafter_ckpt("dflash2")))


@pytest.mark.parametrize("variant", ["no-config", "no-model-type", "no-weights", "missing-path"])
def test_broken_target_refused(variant, tiny_target_dir, copy_ckpt, tmp_path):
    folder = copy_ckpt(tiny_target_dir, "target")
    if variant == "no-config":
        (folder / "config.json").unlink()
        fragment = "has no config.json"
    elif variant == "no-model-type":
        cfg = json.loads((folder / "config.json").read_text())
        del cfg["model_type"]
        (folder / "config.json").write_text(json.dumps(cfg))
        fragment = "has no model_type"
    elif variant == "no-weights":
        (folder / WEIGHTS).unlink()
        fragment = r"has no \.safetensors weights"
    else:
        folder = tmp_path / "nowhere"
        fragment = "does not exist"
    with pytest.raises(CheckpointError, match=fragment):
        load_target(str(folder))


def test_errors_share_one_base():
    for cls in (CheckpointError, ConfigError, IncompatibleError, UnsupportedModelError):
        assert issubclass(cls, DFlashError)
