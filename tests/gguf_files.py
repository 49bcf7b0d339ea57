"""Tiny GGUF files in the real format, written with llama.cpp's own `gguf` package
(GGUFWriter, and gguf.quants for Q8_0 / Q4_0 / Q4_1 in numpy), with random weights and a
tiny byte-level BPE vocabulary; and the float reference of each: an mlx-lm model built from
the same weights in the HF layout, dequantized by `gguf.quants` (not by MLX).

Names, metadata keys and llama's q/k row permutation follow llama.cpp's
convert_hf_to_gguf.py, written out here apart from the converter under test.
"""

from pathlib import Path

import numpy as np

H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF = 64, 2, 4, 2, 16, 128
ROPE_THETA, EPS = 5000.0, 1e-5
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


def hf_weights(family: str, vocab: int, tie: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under the HF checkpoint names, in the HF layout."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.15):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"model.embed_tokens.weight": w(vocab, H, scale=0.5), "model.norm.weight": 1 + w(H, scale=0.1)}
    if not tie:
        out["lm_head.weight"] = w(vocab, H)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": 1 + w(H, scale=0.1), p + "post_attention_layernorm.weight": 1 + w(H, scale=0.1),
            p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, H), p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, H),
            p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, H), p + "self_attn.o_proj.weight": w(H, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": w(FF, H), p + "mlp.up_proj.weight": w(FF, H), p + "mlp.down_proj.weight": w(H, FF),
        })
        if family == "qwen2":
            out.update({p + "self_attn.q_proj.bias": w(HEADS * HEAD_DIM), p + "self_attn.k_proj.bias": w(KV_HEADS * HEAD_DIM),
                        p + "self_attn.v_proj.bias": w(KV_HEADS * HEAD_DIM)})
        if family == "qwen3":
            out.update({p + "self_attn.q_norm.weight": 1 + w(HEAD_DIM, scale=0.1),
                        p + "self_attn.k_norm.weight": 1 + w(HEAD_DIM, scale=0.1)})
    return out


_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    module, part = rest.rsplit(".", 1)
    return f"blk.{i}.{_BLOCK[module]}.{part}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rope pairs interleaved per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, family: str = "llama", linear: str = "Q8_0", embed: str = "Q8_0", tie: bool = True,
               arch: str | None = None, tokenizer_model: str = "gpt2", pre: str = "gpt2", drop: tuple = (),
               raw_types: dict | None = None, huge: str | None = None) -> tuple[Path, dict, dict]:
    """Write a tiny `family` GGUF; returns (path, HF config, float reference weights).

    `linear` / `embed`: GGML types of the 2-D projection and embedding tensors; `drop`: GGUF
    tensor names to leave out; `raw_types`: GGUF name -> type, overriding the others; `huge`: a
    GGUF tensor given one value past float16's range (BF16 holds it)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    tok = tiny_bpe()
    tokens, merges = bpe_parts(tok)
    V = len(tokens)
    weights = hf_weights(family, V, tie)
    writer = gguf.GGUFWriter(str(path), arch or family)
    writer.add_name(f"tiny-{family}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(H)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_vocab_size(V)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    reference = {}
    for hf, w in weights.items():
        name = gguf_name(hf)
        kind = embed if name == "token_embd.weight" else linear if w.ndim == 2 else "F32"
        kind = (raw_types or {}).get(name, kind)
        qtype = T[kind]
        if name == huge:
            w = w.copy()
            w[0, 0] = 1e6
        stored = w
        if family == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            stored = llama_cpp_permute(w, HEADS if "attn_q" in name else KV_HEADS)
        if kind in ("F32", "F16"):
            data = stored.astype(np.float16 if kind == "F16" else np.float32)
            reference[hf] = w.astype(data.dtype).astype(np.float32)
        else:
            data = gguf.quants.quantize(stored, qtype)
            # Rows quantize independently, so the permutation commutes with (de)quantization.
            reference[hf] = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)
        if name not in drop:
            writer.add_tensor(name, data, raw_dtype=None if kind in ("F32", "F16") else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = {"model_type": family, "hidden_size": H, "num_hidden_layers": LAYERS, "intermediate_size": FF,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "rms_norm_eps": EPS, "vocab_size": V, "max_position_embeddings": 512, "rope_theta": ROPE_THETA,
              "tie_word_embeddings": tie}
    return Path(path), config, reference


def reference_model(config: dict, reference: dict):
    """The float mlx-lm model of those weights: the oracle the converted folder must match."""
    import importlib

    import mlx.core as mx

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    model.load_weights([(k, mx.array(v)) for k, v in reference.items()], strict=True)
    model.set_dtype(mx.float32)
    return model
