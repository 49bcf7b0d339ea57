"""Every common GGML type and the families people run, as GGUF targets (docs/gguf.md).

Files are written in the real format with gguf-py's writer (K-quant blocks by
tests/gguf_kquants.py, checked here against gguf-py's own dequantizer) and converted through
the real code path. Oracles: gguf-py's dequantization of the file (weights), an mlx-lm float
model of those weights (logits), and SentencePiece itself (tokenizer ids).
"""

import json

import gguf
import mlx.core as mx
import numpy as np
import pytest

from gguf_files import KQUANT, SMALL, TEXT, Dims, hf_weights, reference_model, tiny_spm, write_gguf
from gguf_kquants import QUANTIZERS, quantize
from test_cli import assert_one_line_error

from dflash2_mlx.loading.gguf.convert import convert_gguf
from dflash2_mlx.loading.gguf.repack import EXACT_BITS, REQUANTIZED_BITS, repack

T = gguf.GGMLQuantizationType
IDS = [5, 40, 77, 120, 3, 9, 250, 31, 64, 100, 18, 200]
LEGACY = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL")  # one fp16 scale per 32 values: held exactly
K_EXACT = ("Q4_K", "Q5_K")  # 32-value sub-blocks: exact up to the fp16 rounding of d·sc and dmin·m
K_REQUANT = ("Q6_K", "Q3_K", "Q2_K")  # 16-value sub-blocks: requantized at the same bits
ALL_TYPES = ("F32", "F16", "BF16") + LEGACY + K_EXACT + K_REQUANT  # and IQ4_NL, in LEGACY


def weights(rows=16, cols=512, seed=0):
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.1).astype(np.float32)


@pytest.mark.parametrize("kind", sorted(QUANTIZERS))
def test_the_test_k_quantizer_writes_blocks_gguf_py_reads_back(kind):
    w = weights()
    back = gguf.quants.dequantize(quantize(w, kind), T[kind]).reshape(w.shape)
    rms = np.sqrt(((back - w) ** 2).mean() / (w ** 2).mean())
    # Round-to-nearest at 2..6 bits: 0.33, 0.18, 0.077, 0.038, 0.022 of the weights' rms; a block
    # layout read back wrong gives an error the size of the weights themselves.
    assert rms < {"Q2_K": 0.4, "Q3_K": 0.25, "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}[kind]


def mlx_values(packed) -> np.ndarray:
    """The repacked weight as MLX computes it, in float32 (the stored scales, not re-rounded)."""
    return np.array(mx.dequantize(packed.weight, packed.scales.astype(mx.float32), packed.biases.astype(mx.float32),
                                  group_size=32, bits=packed.bits))


@pytest.mark.parametrize("kind", LEGACY + K_EXACT + K_REQUANT)
def test_each_type_repacks_onto_mlx_groups_of_32(kind):
    w = weights()
    raw = quantize(w, kind)
    want = gguf.quants.dequantize(raw, T[kind]).reshape(w.shape)
    packed = repack(kind, raw, w.shape[1])
    got = mlx_values(packed)
    assert packed.bits == (EXACT_BITS.get(kind) or REQUANTIZED_BITS[kind])
    assert packed.scales.dtype == mx.float16 and packed.scales.shape == (16, 512 // 32)
    err = np.abs(got - want).reshape(16, -1, 32)
    scale = np.abs(np.array(packed.scales.astype(mx.float32)))[..., None]
    bias = np.abs(np.array(packed.biases.astype(mx.float32)))[..., None]
    if kind in LEGACY:
        assert err.max() == 0  # d and offset·d are fp16 numbers: the same values, bit for bit
    elif kind in K_EXACT:
        # Only d·sc and dmin·m were rounded to fp16 (relative 2^-11): at most that of each term.
        qmax = 2 ** packed.bits - 1
        assert (err <= 2.0 ** -11 * (qmax * scale + bias) * 1.01).all()
        assert err.max() > 0  # the premise: the products do not all fit fp16
    else:
        # Pairs of sub-blocks on one grid: at most half a step, plus the fp16 rounding of s and b;
        # and on the whole less than half the format's own rounding of the weights (measured here:
        # 0.2x for Q6_K, 0.4x for Q3_K, 0.43x for Q2_K), which a grid built from a misread scale is not.
        qmax = 2 ** packed.bits - 1
        assert (err <= 0.5 * scale + 2.0 ** -11 * (qmax * scale + bias) * 1.01).all()
        assert np.sqrt(((got - want) ** 2).mean()) < 0.5 * np.sqrt(((want - w) ** 2).mean())


def test_a_q4_k_repack_with_its_nibbles_or_sub_block_scales_wrong_is_caught(monkeypatch):
    """The check above fails when the repack is broken by hand: the premise of trusting it."""
    from dflash2_mlx.loading.gguf import repack as module

    w = weights()
    raw = quantize(w, "Q4_K")
    want = gguf.quants.dequantize(raw, T.Q4_K).reshape(w.shape)
    good = module.decode_blocks

    def swapped_nibbles(kind, blocks):
        q, s, b = good(kind, blocks)
        q = q.reshape(-1, 4, 2, 32)[:, :, ::-1].reshape(q.shape)  # high nibbles read as the low ones
        return q, s, b

    def shifted_scales(kind, blocks):
        q, s, b = good(kind, blocks)
        return q, np.roll(s, 1, axis=1), b  # each sub-block given its neighbour's scale

    for broken in (swapped_nibbles, shifted_scales):
        monkeypatch.setattr(module, "decode_blocks", broken)
        assert np.abs(mlx_values(repack("Q4_K", raw, 512)) - want).max() > 0.05


def converted_logits(folder) -> np.ndarray:
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    model.set_dtype(mx.float32)  # packed weights stay packed
    return np.array(model(mx.array([IDS])))


def in_memory_bytes(folder) -> int:
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def logits_error(folder, config, reference) -> tuple[float, float]:
    """(max |Δlogit| of the converted model against the file's exact values, max |Δlogit| of
    those exact values against the unquantized weights they came from: the format's own error)."""
    ours = converted_logits(folder)
    want = np.array(reference_model(config, reference)(mx.array([IDS])))
    original = hf_weights(config["model_type"], config["vocab_size"], config["tie_word_embeddings"],
                          dims=Dims(config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
                                    config["num_key_value_heads"], config["head_dim"], config["intermediate_size"]))
    unquantized = np.array(reference_model(config, original)(mx.array([IDS])))
    return float(np.abs(ours - want).max()), float(np.abs(want - unquantized).max())


# The converted model's distance from the file's exact values, as a fraction of the format's own
# distance from the unquantized weights. Exact types: fp16 rounding only. Q4_K/Q5_K: the fp16
# rounding of d·sc and dmin·m. The 16-value types: their requantization (docs/gguf.md).
# The 16-value types' pairs on one finer grid move this small random model's logits by 0.23x
# (Q6_K), 0.62x (Q3_K) and 1.1x (Q2_K) what the format's own rounding does (at their own bits:
# up to 1.3x); docs/gguf.md measures SmolLM2.
SHARE_OF_OWN_ERROR = {"Q4_K": 0.05, "Q5_K": 0.05, "Q6_K": 0.4, "Q3_K": 0.8, "Q2_K": 1.3}
# Model bytes in memory over file bytes: the homes' bits and fp16 scale + bias per 32 values
# against the type's own bits per value (Q6_K 9 / 6.56, Q3_K 5 / 3.44, Q2_K 4 / 2.63, IQ4_NL
# 9 / 4.5), with float norms beside them.
MEMORY = {"IQ4_NL": 2.1, "Q6_K": 1.45, "Q3_K": 1.5, "Q2_K": 1.6}


@pytest.mark.parametrize("kind", ALL_TYPES)
def test_every_type_loads_as_a_model_that_matches_the_float_reference(tmp_path, kind):
    dims = KQUANT if kind.endswith("_K") else SMALL
    path, config, reference = write_gguf(tmp_path / "m.gguf", "llama", kind, kind, tie=True, dims=dims)
    folder = convert_gguf(path, tmp_path / "out")
    err, own = logits_error(folder, config, reference)
    if kind in SHARE_OF_OWN_ERROR:
        assert err <= SHARE_OF_OWN_ERROR[kind] * own, (err, own)
    else:
        want = np.array(reference_model(config, reference)(mx.array([IDS])))
        assert err <= 1e-3 * np.abs(want).max()
    saved = json.loads((folder / "config.json").read_text())
    if kind in ("F32", "F16", "BF16"):
        assert "quantization" not in saved
    else:
        assert saved["quantization"]["bits"] == (EXACT_BITS.get(kind) or REQUANTIZED_BITS[kind])
    # Never silently widened: the model in memory is about the file's size.
    assert in_memory_bytes(folder) <= MEMORY.get(kind, 1.15) * path.stat().st_size


def test_a_q4_k_m_mix_loads_near_the_size_of_the_file(tmp_path):
    """Q4_K_M as llama.cpp writes it: Q4_K, with Q6_K for the (tied) embedding and half the
    attn_v / ffn_down tensors, and Q5_0 where a row is not a multiple of 256."""
    mix = {"token_embd.weight": "Q6_K", "blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K",
           "blk.1.attn_output.weight": "Q5_0"}
    path, config, reference = write_gguf(tmp_path / "m.gguf", "llama", "Q4_K", "Q4_K", dims=KQUANT, raw_types=mix)
    folder = convert_gguf(path, tmp_path / "out")
    quant = json.loads((folder / "config.json").read_text())["quantization"]
    assert quant["bits"] == 4 and quant["model.embed_tokens"]["bits"] == 8  # Q6_K's home: 8 bits
    assert quant["model.layers.0.mlp.down_proj"]["bits"] == 8 and quant["model.layers.1.self_attn.o_proj"]["bits"] == 5
    err, own = logits_error(folder, config, reference)
    assert err <= SHARE_OF_OWN_ERROR["Q6_K"] * own, (err, own)
    assert in_memory_bytes(folder) <= 1.2 * path.stat().st_size


def test_bf16_stays_bfloat16_with_values_past_float16s_range(tmp_path):
    path, config, reference = write_gguf(tmp_path / "m.gguf", "llama", "BF16", "BF16",
                                         huge="blk.0.ffn_up.weight")
    folder = convert_gguf(path, tmp_path / "out")
    stored = mx.load(str(folder / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"]
    assert stored.dtype == mx.bfloat16 and stored[0, 0].item() == reference["model.layers.0.mlp.up_proj.weight"][0, 0]


@pytest.mark.parametrize("kind", ["IQ4_XS", "TQ2_0"])
def test_iq_and_ternary_types_are_one_line_naming_the_type(cli, tmp_path, kind):
    path, _, _ = write_gguf(tmp_path / "m.gguf", "llama", "Q8_0", "Q8_0", dims=KQUANT,
                            raw_types={"blk.0.ffn_up.weight": kind})
    code, out, err = cli(["convert", path, tmp_path / "out"])
    assert_one_line_error(code, out, err)
    assert kind in err and "blk.0.ffn_up.weight" in err
    assert not (tmp_path / "out").exists()


# -- families ------------------------------------------------------------------------------------

LLAMA3 = dict(factor=8.0, low=1.0, high=4.0, orig=64)
FAMILIES = {  # name -> write_gguf arguments
    "llama3-rope": dict(family="llama", dims=Dims(hidden=128, heads=2, kv_heads=1, head_dim=64, ff=256),
                        theta=500000.0, llama3_rope=LLAMA3),
    "gemma3": dict(family="gemma3", tokenizer_model="llama", dims=Dims(layers=6), sliding_window=4),
    "phi3": dict(family="phi3", tokenizer_model="llama"),
    "mistral": dict(family="llama", tokenizer_model="llama"),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_matches_mlx_lms_model_of_the_original_weights(tmp_path, name):
    path, config, reference = write_gguf(tmp_path / "m.gguf", linear="Q8_0", embed="Q8_0", **FAMILIES[name])
    folder = convert_gguf(path, tmp_path / "out")
    saved = json.loads((folder / "config.json").read_text())
    for key, want in config.items():
        got = saved[key]
        if isinstance(want, dict):
            assert {k: v if isinstance(v, str) else pytest.approx(v, rel=1e-4) for k, v in want.items()} == got, key
        else:
            assert got == pytest.approx(want), key
    ours = converted_logits(folder)
    want = np.array(reference_model(config, reference)(mx.array([IDS])))
    assert np.abs(ours - want).max() <= 1e-3 * np.abs(want).max()
    if name == "llama3-rope":  # the premise: without its rope scaling the model is another one
        plain = reference_model({k: v for k, v in config.items() if k != "rope_scaling"}, reference)
        assert np.abs(ours - np.array(plain(mx.array([IDS])))).max() > 1e-2 * np.abs(want).max()


@pytest.mark.parametrize("family", ["llama", "gemma3", "phi3"])
def test_a_sentencepiece_vocabulary_tokenizes_as_sentencepiece_does(tmp_path, family):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    extra = dict(dims=Dims(layers=6)) if family == "gemma3" else {}
    path, _, _ = write_gguf(tmp_path / "m.gguf", family, tokenizer_model="llama", **extra)
    folder = convert_gguf(path, tmp_path / "out")
    ours, sp = load_tokenizer(folder), tiny_spm(space_prefix=family != "gemma3")
    texts = [TEXT, "x = 12345 + 678  # the capital\n\n\tdef  f():", "é ü 中文 🙂 (bytes)", "Paris"]
    for text in texts:
        assert ours.encode(text) == [sp.bos_id()] + sp.encode(text), text
        assert ours.decode(sp.encode(text)) == text


# -- DFlash on a GGUF target, and the converted folders in mlx-lm itself -------------------------


def test_dflash2_on_a_k_quant_qwen3_gguf_target_is_token_identical_to_ar(cli, tmp_path):
    from test_cli import parse_one_json

    from dflash2_mlx.tools.synthetic import drafter_config_dict, write_drafter

    mix = {"token_embd.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K", "blk.1.attn_v.weight": "Q5_0"}
    path, config, _ = write_gguf(tmp_path / "m.gguf", "qwen3", "Q4_K", "Q4_K", dims=KQUANT, raw_types=mix)
    drafter = write_drafter(tmp_path / "drafter", drafter_config_dict(config, "dflash2", block_size=8))
    runs = {}
    for name, flags in (("ar", ["--ar"]), ("dflash2", ["--drafter", drafter, "--block-size", 8])):
        code, out, err = cli(["generate", "--model", path, *flags, "-p", "def add(a, b):", "-m", 24, "--json"])
        assert code == 0, err
        runs[name] = parse_one_json(out)
    assert runs["dflash2"]["stats"]["mode"] == "dflash2" and runs["dflash2"]["stats"]["target_passes"] > 0
    assert runs["dflash2"]["token_ids"] == runs["ar"]["token_ids"] and len(runs["ar"]["token_ids"]) == 24


@pytest.mark.parametrize("name", ["llama3-rope", "gemma3", "phi3"])
def test_a_converted_folder_runs_in_mlx_lm_generate_as_it_is(tmp_path, name):
    from mlx_lm import load, stream_generate

    path, config, reference = write_gguf(tmp_path / "m.gguf", linear="Q4_K", embed="Q6_K",
                                         **{**FAMILIES[name], "dims": _kquant_dims(FAMILIES[name])})
    folder = convert_gguf(path, tmp_path / "out")
    model, tokenizer = load(str(folder))
    model.set_dtype(mx.float32)  # fp32 as the oracle: tiny random models have near-ties
    prompt = tokenizer.encode("def add(a, b):")
    got = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=12)]
    # The oracle: the folder's weights dequantized into mlx-lm's float model, greedy step by step.
    from mlx_lm.utils import dequantize_model, load_model

    dense = dequantize_model(load_model(folder)[0])
    dense.set_dtype(mx.float32)
    ids = list(prompt)
    for _ in range(12):
        ids.append(int(mx.argmax(dense(mx.array([ids]))[0, -1]).item()))
    assert got == ids[len(prompt):]


def _kquant_dims(kwargs: dict) -> Dims:
    """The family's test dimensions widened so every row is a whole K-quant block of 256."""
    d = kwargs.get("dims", SMALL)
    return Dims(hidden=256, layers=d.layers, heads=4, kv_heads=d.kv_heads, head_dim=64, ff=512)
