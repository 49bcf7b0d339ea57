"""Tiny GGUF files in the real format, written with llama.cpp's own `gguf` package
(GGUFWriter, and gguf.quants for Q8_0 / Q4_0 / Q4_1 in numpy), with random weights and a
tiny byte-level BPE vocabulary; and the float reference of each: an mlx-lm model built from
the same weights in the HF layout, dequantized by `gguf.quants` (not by MLX).

Names, metadata keys and llama's q/k row permutation follow llama.cpp's
convert_hf_to_gguf.py, written out here apart from the converter under test.
"""

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gguf_kquants import quantize

ROPE_THETA, EPS = 5000.0, 1e-5


@dataclass(frozen=True)
class Dims:
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ff: int = 128


SMALL = Dims()
KQUANT = Dims(hidden=256, heads=4, kv_heads=2, head_dim=64, ff=512)  # K-quant rows are multiples of 256
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF = (SMALL.hidden, SMALL.layers, SMALL.heads, SMALL.kv_heads,
                                            SMALL.head_dim, SMALL.ff)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT = ("def add(a, b):\n    return a + b\n\nThe capital of France is Paris. Numbers: 12345 and 678.\n"
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n") * 4


def tiny_bpe(vocab_size: int = 300):
    """A byte-level BPE (tokenizers), the specials first, as llama.cpp's 'gpt2' kind holds it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    return tok


def bpe_parts(tok) -> tuple[list[str], list[str]]:
    """(tokens by id, merges as 'a b') of a trained BPE, as llama.cpp stores them."""
    import json

    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def hf_weights(family: str, vocab: int, tie: bool, seed: int = 0, dims: Dims = SMALL) -> dict[str, np.ndarray]:
    """Random float32 weights under mlx-lm's (the HF checkpoint's) names, in the HF layout."""
    rng = np.random.default_rng(seed)
    h, hd, ff = dims.hidden, dims.head_dim, dims.ff
    q, kv = dims.heads * hd, dims.kv_heads * hd

    def w(*shape, scale=0.15):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):  # Gemma's norms are offsets from 1 (it computes x * (1 + w))
        return w(n, scale=0.1) if family == "gemma3_text" else 1 + w(n, scale=0.1)

    out = {"model.embed_tokens.weight": w(vocab, h, scale=0.5), "model.norm.weight": norm(h)}
    if not tie:
        out["lm_head.weight"] = w(vocab, h)
    for i in range(dims.layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
                    p + "self_attn.o_proj.weight": w(h, q), p + "mlp.down_proj.weight": w(h, ff)})
        if family == "phi3":
            out.update({p + "self_attn.qkv_proj.weight": w(q + 2 * kv, h), p + "mlp.gate_up_proj.weight": w(2 * ff, h)})
            continue
        out.update({p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                    p + "self_attn.v_proj.weight": w(kv, h), p + "mlp.gate_proj.weight": w(ff, h),
                    p + "mlp.up_proj.weight": w(ff, h)})
        if family == "qwen2":
            out.update({p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                        p + "self_attn.v_proj.bias": w(kv)})
        if family in ("qwen3", "gemma3_text"):
            out.update({p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd)})
        if family == "gemma3_text":
            out.update({p + "pre_feedforward_layernorm.weight": norm(h), p + "post_feedforward_layernorm.weight": norm(h)})
    return out


_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_FAMILY_BLOCK = {  # where llama.cpp's names differ from llama's for the same HF module
    "gemma3_text": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                    "post_feedforward_layernorm": "post_ffw_norm"},
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
}


def gguf_name(hf: str, family: str = "llama") -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    module, part = rest.rsplit(".", 1)
    return f"blk.{i}.{_FAMILY_BLOCK.get(family, {}).get(module) or _BLOCK[module]}.{part}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rope pairs interleaved per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


MODEL_TYPE = {"gemma3": "gemma3_text"}  # GGUF architecture -> mlx-lm model_type, where they differ


def tiny_spm(space_prefix: bool = True):
    """A SentencePiece BPE with byte fallback, trained on TEXT as Llama's was set up (no text
    normalisation, spaces kept); `space_prefix` is its add_dummy_prefix (Gemma's is off)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT.splitlines() * 3), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=space_prefix, split_digits=True, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def spm_parts(sp) -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, llama.cpp token types) as convert_hf_to_gguf.py's SentencePiece path writes them."""
    def kind(i):
        return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1

    n = sp.get_piece_size()
    return [sp.id_to_piece(i) for i in range(n)], [sp.get_score(i) for i in range(n)], [kind(i) for i in range(n)]


def llama3_rope_freqs(dims: Dims, theta: float, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: Llama 3's per-frequency factors."""
    freqs = 1.0 / (theta ** (np.arange(0, dims.head_dim, 2, dtype=np.float32) / dims.head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path: Path, family: str = "llama", linear: str = "Q8_0", embed: str = "Q8_0", tie: bool = True,
               arch: str | None = None, tokenizer_model: str = "gpt2", pre: str = "gpt2", drop: tuple = (),
               raw_types: dict | None = None, huge: str | None = None, dims: Dims = SMALL,
               llama3_rope: dict | None = None, sliding_window: int = 4, theta: float = ROPE_THETA,
               extra_tensors: dict | None = None, extra_kv: dict | None = None) -> tuple[Path, dict, dict]:
    """Write a tiny `family` GGUF (a llama.cpp architecture name); returns (path, mlx-lm config,
    float reference weights under mlx-lm's names).

    `linear` / `embed`: GGML types of the 2-D projection and embedding tensors; `drop`: GGUF
    tensor names to leave out; `raw_types`: GGUF name -> type, overriding the others; `huge`: a
    GGUF tensor given one value past float16's range; `tokenizer_model` "llama" writes a
    SentencePiece vocabulary (tiny_spm) instead of the byte-level BPE; `llama3_rope`: Llama 3's
    rope-scaling parameters, written as llama.cpp does (a rope_freqs tensor); `extra_tensors` /
    `extra_kv`: more F32 tensors / string metadata, as files this converter must refuse carry."""
    import gguf
    from gguf import GGMLQuantizationType as T

    model_type = MODEL_TYPE.get(family, family)
    gemma = model_type == "gemma3_text"
    tie = tie or gemma  # Gemma 3 always ties its head to the embedding
    if tokenizer_model == "llama":
        sp = tiny_spm(space_prefix=not gemma)
        tokens, scores, types = spm_parts(sp)
    else:
        tokens, merges = bpe_parts(tiny_bpe())
        types = [3 if t in SPECIAL else 1 for t in tokens]
    V = len(tokens)
    weights = hf_weights(model_type, V, tie, dims=dims)
    writer = gguf.GGUFWriter(str(path), arch or family)
    writer.add_name(f"tiny-{family}")
    writer.add_block_count(dims.layers)
    writer.add_context_length(512)
    writer.add_embedding_length(dims.hidden)
    writer.add_feed_forward_length(dims.ff)
    writer.add_head_count(dims.heads)
    writer.add_head_count_kv(dims.kv_heads)
    writer.add_key_length(dims.head_dim)
    writer.add_value_length(dims.head_dim)
    writer.add_rope_dimension_count(dims.head_dim)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_vocab_size(V)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if tokenizer_model == "llama":
        writer.add_token_scores(scores)
        writer.add_unk_token_id(sp.unk_id())
        writer.add_bos_token_id(sp.bos_id())
        writer.add_eos_token_id(sp.eos_id())
        writer.add_pad_token_id(sp.unk_id())  # as real files name one (transformers' Phi-3 default is 32000)
        writer.add_add_bos_token(True)
        writer.add_add_space_prefix(not gemma)
    else:
        writer.add_tokenizer_pre(pre)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    if gemma:
        writer.add_sliding_window(sliding_window)
    for key, val in (extra_kv or {}).items():
        writer.add_string(key, val)
    for name, val in (extra_tensors or {}).items():
        writer.add_tensor(name, np.asarray(val, np.float32))
    reference = {}
    for hf, w in weights.items():
        name = gguf_name(hf, model_type)
        kind = embed if name == "token_embd.weight" else linear if w.ndim == 2 else "F32"
        kind = (raw_types or {}).get(name, kind)
        if name == huge:
            w = w.copy()
            w[0, 0] = 1e6
        stored = w
        if family == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            stored = llama_cpp_permute(w, dims.heads if "attn_q" in name else dims.kv_heads)
        if gemma and name.endswith("norm.weight"):  # llama.cpp stores Gemma's norms as 1 + w
            stored = w + np.float32(1)
            w = stored - np.float32(1)
        if kind in ("F32", "F16", "BF16"):
            data = stored.astype({"F32": np.float32, "F16": np.float16, "BF16": np.float32}[kind])
            if kind == "BF16":
                data = gguf.quants.quantize(data, T.BF16)
                reference[hf] = gguf.quants.dequantize(gguf.quants.quantize(w, T.BF16), T.BF16).reshape(w.shape)
            else:
                reference[hf] = w.astype(data.dtype).astype(np.float32)
        else:
            data = quantize(stored, kind)
            # Rows quantize independently, so the permutation commutes with (de)quantization.
            reference[hf] = gguf.quants.dequantize(quantize(w, kind), T[kind]).reshape(w.shape)
        if gemma and name.endswith("norm.weight"):
            reference[hf] = w
        if name not in drop:
            writer.add_tensor(name, data, raw_dtype=None if kind in ("F32", "F16") else T[kind])
    config = {"model_type": model_type, "hidden_size": dims.hidden, "num_hidden_layers": dims.layers,
              "intermediate_size": dims.ff, "num_attention_heads": dims.heads, "num_key_value_heads": dims.kv_heads,
              "head_dim": dims.head_dim, "rms_norm_eps": EPS, "vocab_size": V, "max_position_embeddings": 512,
              "rope_theta": theta, "tie_word_embeddings": tie}
    if llama3_rope:
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(dims, theta, **llama3_rope))
        config["rope_scaling"] = {"rope_type": "llama3", "factor": llama3_rope["factor"],
                                  "low_freq_factor": llama3_rope["low"], "high_freq_factor": llama3_rope["high"],
                                  "original_max_position_embeddings": llama3_rope["orig"]}
    if gemma:
        config.update(query_pre_attn_scalar=dims.head_dim, sliding_window=sliding_window, sliding_window_pattern=6,
                      rope_local_base_freq=10000.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path), config, reference


def reference_model(config: dict, reference: dict):
    """The float mlx-lm model of those weights: the oracle the converted folder must match."""
    import importlib

    import mlx.core as mx

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = {k: mx.array(v) for k, v in reference.items()}
    if hasattr(model, "sanitize"):  # as mlx-lm's loader does (Gemma 3 ties its head there)
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()), strict=True)
    model.set_dtype(mx.float32)
    return model
