"""Draft quantization: the spec string, what gets quantized, and the saved MLX copy."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from conftest import hash_tree
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.errors import DFlashError
from dflash2_mlx.loading.checkpoints import load_drafter
from dflash2_mlx.loading.load_pair import load_pair
from dflash2_mlx.loading.quantize import CODEBOOK_MIN_BITS, DraftQuant, quantize_drafter, save_quantized_drafter

# -- the spec string ---------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, bits, activation, group_size, dtype",
    [
        ("w4a32:gs64", 4, "32", 64, mx.float32),
        ("w8a32", 8, "32", 64, mx.float32),
        ("w4abf16:gs32", 4, "bf16", 32, mx.bfloat16),
        ("w8a32:gs128", 8, "32", 128, mx.float32),
        (" W4A32:GS64 ", 4, "32", 64, mx.float32),
    ],
)
def test_parse_accepts(spec, bits, activation, group_size, dtype):
    q = DraftQuant.parse(spec)
    assert (q.bits, q.activation, q.group_size) == (bits, activation, group_size)
    assert q.activation_dtype == dtype
    assert DraftQuant.parse(str(q)) == q


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("w4", "is not understood"),
        ("int4", "is not understood"),
        ("", "is not understood"),
        ("w4a8", "is not understood"),
        ("w4a32:gs", "is not understood"),
        ("w4a32gs64", "is not understood"),
        ("w4a32:g64", "is not understood"),
        ("w-4a32", "is not understood"),
        ("w3a32", "bits 3 not supported"),
        ("w2a32:gs64", "bits 2 not supported"),
        ("w16a32", "bits 16 not supported"),
        ("w4a32:gs48", "group size 48"),
        ("w8a32:gs256", "group size 256"),
        ("w4a32:gs0", "group size 0"),
    ],
)
def test_parse_refuses(spec, fragment):
    with pytest.raises(DFlashError, match=fragment) as e:
        DraftQuant.parse(spec)
    message = str(e.value)
    assert "\n" not in message
    assert "use" in message  # says what would work


# -- quantizing in memory ----------------------------------------------------------------


@pytest.fixture(scope="module")
def quant_ckpt(drafter_ckpt, scaled_config):
    """A DFlash 2 drafter whose selector rank (64) every group size divides evenly."""
    return drafter_ckpt("dflash2", config=scaled_config("dflash2", {"selector_rank": 64}))


def _modules(drafter):
    return dict(drafter.named_modules())


def _linear_paths(drafter):
    return sorted(p for p, m in drafter.named_modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("spec", ["w4a32:gs64", "w8a32", "w4abf16:gs32"])
def test_quantize_drafter_layers(spec, quant_ckpt):
    drafter = load_drafter(str(quant_ckpt))
    linears = _linear_paths(drafter)
    floats_before = {
        name: value for name, value in tree_flatten(drafter.parameters())
        if "norm" in name or name.endswith("base_kernel")
    }
    q = DraftQuant.parse(spec)
    meta = quantize_drafter(drafter, q)
    modules = _modules(drafter)
    assert linears  # fc, attention, MLP, conv kernel projections, selector gate
    for path in linears:
        m = modules[path]
        assert isinstance(m, nn.QuantizedLinear), path
        assert (m.bits, m.group_size) == (q.bits, q.group_size), path
    assert not [p for p, m in drafter.named_modules() if type(m) in (nn.Linear, nn.Embedding)]
    for name in ("predecessor_codebook", "successor_codebook"):
        book = modules[f"candidate_selector.{name}"]
        assert isinstance(book, nn.QuantizedEmbedding)
        assert book.bits == max(q.bits, CODEBOOK_MIN_BITS) >= 8
        assert book.weight.shape[0] == drafter.config.vocab_size
    params = dict(tree_flatten(drafter.parameters()))
    for name, before in floats_before.items():
        after = params[name]
        assert after.dtype == q.activation_dtype, name  # still a float, never packed
        assert after.shape == before.shape, name
        assert mx.array_equal(after, before.astype(q.activation_dtype)).item(), name
    assert drafter.activation_dtype == q.activation_dtype
    # The returned metadata is mlx-lm's layout and says the same.
    assert (meta["bits"], meta["group_size"], meta["mode"]) == (q.bits, q.group_size, "affine")
    overrides = {k: v for k, v in meta.items() if k not in ("bits", "group_size", "mode")}
    if q.bits < CODEBOOK_MIN_BITS:
        assert overrides == {f"candidate_selector.{n}_codebook": {
            "group_size": q.group_size, "bits": CODEBOOK_MIN_BITS, "mode": "affine"}
            for n in ("predecessor", "successor")}
    else:
        assert overrides == {}


def test_quantize_v1_drafter(drafter_ckpt):
    drafter = load_drafter(str(drafter_ckpt("dflash")))
    quantize_drafter(drafter, DraftQuant.parse("w4a32:gs32"))
    assert all(isinstance(m, nn.QuantizedLinear) and m.bits == 4
               for p, m in drafter.named_modules() if hasattr(m, "bits"))
    assert not hasattr(drafter, "candidate_selector")


def test_widths_the_group_does_not_divide_stay_float(quant_ckpt):
    """gs128 on a 64-wide drafter: only layers whose input width 128 divides are
    quantized (the MLP's down_proj reads 128); the rest, fc (5 x 64 = 320) included,
    stay float and the metadata marks them False."""
    drafter = load_drafter(str(quant_ckpt))
    meta = quantize_drafter(drafter, DraftQuant.parse("w4a32:gs128"))
    modules = _modules(drafter)
    for path, m in modules.items():
        if isinstance(m, (nn.Linear, nn.QuantizedLinear)):
            width = m.weight.shape[1] * (32 // m.bits if isinstance(m, nn.QuantizedLinear) else 1)
            assert isinstance(m, nn.QuantizedLinear) == (width % 128 == 0), path
            assert (meta.get(path) is False) == (width % 128 != 0), path
    assert isinstance(modules["layers.0.mlp.down_proj"], nn.QuantizedLinear)
    assert isinstance(modules["fc"], nn.Linear) and meta["fc"] is False


# -- saving and loading back ------------------------------------------------------------------


def _inputs(drafter, seed=3):
    """One block of embedded rows and some pending target features."""
    c = drafter.config
    key = mx.random.key(seed)
    k1, k2 = mx.random.split(key)
    block = mx.random.normal((1, c.block_size, c.hidden_size), key=k1)
    features = mx.random.normal((1, 7, len(c.target_layer_ids) * c.hidden_size), key=k2)
    return block, features


def _outputs(drafter, block, features):
    cache = drafter.make_cache()
    first = drafter(block, features, cache)
    second = drafter(block, features[:, :3], cache)  # a second cycle reads the cached context
    outs = [first, second]
    if drafter.is_dflash2:
        sel = drafter.candidate_selector
        ids = mx.array([[0, 5, drafter.config.vocab_size - 1]])
        outs += [sel.predecessor_codebook(ids), sel.successor_codebook(ids), sel.hidden_projection(first)]
    mx.eval(outs)
    return outs


@pytest.mark.parametrize("spec", ["w4a32:gs64", "w8a32", "w4abf16:gs32", "w4a32:gs128"])
def test_saved_copy_reloads_bitwise(spec, quant_ckpt, tmp_path):
    source_hashes = hash_tree(quant_ckpt)
    source_config = json.loads((quant_ckpt / "config.json").read_text())
    q = DraftQuant.parse(spec)
    drafter = load_drafter(str(quant_ckpt))
    meta = quantize_drafter(drafter, q)
    out = save_quantized_drafter(drafter, source_config, meta, q, quant_ckpt, tmp_path / "quantized")
    assert out == (tmp_path / "quantized").resolve()
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quantized"]  # no temp folder left
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())

    saved = json.loads((out / "config.json").read_text())
    assert saved["quantization"] == meta
    assert saved["quantization_config"] == meta
    assert saved["dflash2_mlx"]["draft_quant"] == str(q)
    assert {k: v for k, v in saved.items() if k not in ("quantization", "quantization_config", "dflash2_mlx")} \
        == source_config  # every original key kept, unchanged
    assert hash_tree(quant_ckpt) == source_hashes  # the released checkpoint is untouched

    reloaded = load_drafter(str(out))
    assert reloaded.activation_dtype == q.activation_dtype  # remembered from the saved config
    params, again = dict(tree_flatten(drafter.parameters())), dict(tree_flatten(reloaded.parameters()))
    assert params.keys() == again.keys()
    for name in params:
        assert params[name].dtype == again[name].dtype, name
        assert mx.array_equal(params[name], again[name]).item(), name
    block, features = _inputs(drafter)
    for a, b in zip(_outputs(drafter, block, features), _outputs(reloaded, block, features)):
        assert a.dtype == b.dtype and mx.array_equal(a, b).item()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_quantized_pair_passes_compatibility(tiny_target_dir, drafter_ckpt):
    pair, _ = load_pair(str(tiny_target_dir), str(drafter_ckpt("dflash2")), draft_quant="w4a32:gs32")
    target, drafter = pair.target, pair.drafter
    assert isinstance(drafter.fc, nn.QuantizedLinear) and drafter.fc.bits == 4
    Pair.make(target, drafter)  # the packed fc still reads n_taps x hidden columns


def test_load_pair_refuses_bad_quant_before_loading(tmp_path):
    with pytest.raises(DFlashError, match="'w5a32' is not understood|bits 5 not supported"):
        load_pair(str(tmp_path / "no-target"), str(tmp_path / "no-drafter"), draft_quant="w5a32")


# -- refusing to write where it should not --------------------------------------------------------


@pytest.fixture
def quantized(quant_ckpt):
    q = DraftQuant.parse("w4a32:gs64")
    drafter = load_drafter(str(quant_ckpt))
    meta = quantize_drafter(drafter, q)
    config = json.loads((quant_ckpt / "config.json").read_text())
    return drafter, config, meta, q


def test_refuses_existing_output_folder(quantized, quant_ckpt, tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(DFlashError, match="already exists"):
        save_quantized_drafter(*quantized, quant_ckpt, existing)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    assert (existing / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DFlashError, match="already exists"):
        save_quantized_drafter(*quantized, quant_ckpt, empty)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "existing"]


@pytest.mark.parametrize("spelling", ["same", "trailing-dot", "dotdot", "relative-source"])
def test_refuses_the_source_folder(spelling, quantized, drafter_ckpt, scaled_config, copy_ckpt,
                                   monkeypatch):
    source = copy_ckpt(drafter_ckpt("dflash2", config=scaled_config("dflash2", {"selector_rank": 64})))
    before = hash_tree(source)
    given, out = {"same": (source, source), "trailing-dot": (source, source / "."),
                  "dotdot": (source, source / ".." / source.name),
                  "relative-source": (Path(source.name), source)}[spelling]
    monkeypatch.chdir(source.parent)
    with pytest.raises(DFlashError, match="refusing to overwrite the original drafter"):
        save_quantized_drafter(*quantized, given, out)
    assert hash_tree(source) == before
    assert sorted(p.name for p in source.parent.iterdir()) == [source.name]


def test_unwritable_parent_is_a_file(quantized, quant_ckpt, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in (blocker / "quantized", tmp_path / "missing" / "quantized"):
        with pytest.raises(DFlashError, match="cannot write into") as e:
            save_quantized_drafter(*quantized, quant_ckpt, out)
        assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def _make_unwritable(folder: Path):
    """Read-only for this user; root ignores modes, so it gets the immutable flag."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        return None
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_unwritable_parent_directory(quantized, quant_ckpt, tmp_path):
    parent = tmp_path / "read-only"
    parent.mkdir()
    restore = _make_unwritable(parent)
    if restore is None:
        pytest.skip("cannot make a folder unwritable here (root without chattr)")
    try:
        with pytest.raises(DFlashError, match="cannot write into") as e:
            save_quantized_drafter(*quantized, quant_ckpt, parent / "quantized")
        assert str(parent) in str(e.value)
        assert list(parent.iterdir()) == []
    finally:
        restore()


_FULL_DISK_SCRIPT = """
import json, resource, signal, sys
from pathlib import Path
from dflash2_mlx.errors import DFlashError
from dflash2_mlx.loading.checkpoints import load_drafter
from dflash2_mlx.loading.quantize import DraftQuant, quantize_drafter, save_quantized_drafter
src, out = Path(sys.argv[1]), Path(sys.argv[2])
q = DraftQuant.parse("w8a32")
drafter = load_drafter(str(src))
meta = quantize_drafter(drafter, q)
# Files over 4 KiB fail to grow, as on a full disk (EFBIG instead of SIGXFSZ).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    save_quantized_drafter(drafter, json.loads((src / "config.json").read_text()), meta, q, src, out)
    print("SAVED")
except DFlashError as e:
    print("DFlashError:", e)
"""


def test_failed_write_leaves_nothing(quant_ckpt, tmp_path):
    """A write that fails half-way (here: a file-size limit, like a full disk) gives one
    clear line and removes its temporary folder; the output folder never appears."""
    parent = tmp_path / "out"
    parent.mkdir()
    before = hash_tree(quant_ckpt)
    run = subprocess.run([sys.executable, "-c", _FULL_DISK_SCRIPT, str(quant_ckpt), str(parent / "quantized")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip().splitlines()[-1]
    assert line.startswith("DFlashError: could not write the quantized drafter to"), line
    assert "check free space" in line
    assert list(parent.iterdir()) == []
    assert hash_tree(quant_ckpt) == before
