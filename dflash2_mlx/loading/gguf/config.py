"""A GGUF file's metadata as the mlx-lm config.json of its architecture."""

from dataclasses import dataclass, field

import numpy as np

from ...errors import ConfigError


@dataclass(frozen=True)
class Architecture:
    """How one `general.architecture` maps to an mlx-lm model."""

    model_type: str
    # llama.cpp's converter reorders llama's q/k rows for its interleaved rope (weights.py undoes it).
    permuted_qk: bool
    # GGUF tensor suffixes every block must have.
    block: tuple[str, ...]
    # GGUF block module -> mlx-lm module, where this family differs from llama's names.
    names: dict = field(default_factory=dict)
    # llama.cpp adds this to every `*norm.weight` (Gemma computes x·(1 + w)); weights.py takes it off.
    norm_offset: float = 0.0
    # Tensors that become config entries, not weights (rope factors).
    config_tensors: tuple[str, ...] = ()


LLAMA_BLOCK = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
               "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
ARCHITECTURES = {
    # Mistral 7B and Llama 2 files are `llama` with a SentencePiece vocabulary.
    "llama": Architecture("llama", permuted_qk=True, block=LLAMA_BLOCK, config_tensors=("rope_freqs.weight",)),
    "qwen2": Architecture("qwen2", permuted_qk=False,
                          block=LLAMA_BLOCK + ("attn_q.bias", "attn_k.bias", "attn_v.bias")),
    "qwen3": Architecture("qwen3", permuted_qk=False, block=LLAMA_BLOCK + ("attn_q_norm.weight", "attn_k_norm.weight")),
    "gemma3": Architecture(
        "gemma3_text", permuted_qk=False,
        block=LLAMA_BLOCK + ("attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                             "post_ffw_norm.weight"),
        names={"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
        norm_offset=1.0),
    "phi3": Architecture(
        "phi3", permuted_qk=False,
        block=("attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight", "ffn_up.weight",
               "ffn_down.weight"),
        names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    ),
}
# Gemma 3 as llama.cpp runs it (src/llama-model.cpp): every 6th layer global, local rope base 10k.
GEMMA3_PATTERN, GEMMA3_LOCAL_BASE, GEMMA3_27B_LAYERS = 6, 10000.0, 62


def value(metadata: dict, key: str, default=None):
    """A metadata value as a Python scalar (numpy scalars included)."""
    v = metadata.get(key, default)
    return v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v


def architecture(metadata: dict, where: str) -> Architecture:
    name = value(metadata, "general.architecture")
    if name is None:
        raise ConfigError(f"GGUF '{where}' has no general.architecture: it is not a model file")
    if name not in ARCHITECTURES:
        raise ConfigError(f"GGUF '{where}' is a '{name}' model; supported: {', '.join(ARCHITECTURES)} "
                          "(use an mlx-lm folder for other architectures)")
    return ARCHITECTURES[name]


def mlx_lm_config(metadata: dict, tensors: dict, where: str) -> dict:
    """config.json for mlx-lm from the GGUF metadata (keys as llama.cpp's converter writes them)."""
    arch = architecture(metadata, where)
    a = value(metadata, "general.architecture")

    def need(key):
        v = value(metadata, f"{a}.{key}")
        if v is None:
            raise ConfigError(f"GGUF '{where}' lacks metadata '{a}.{key}': the file is incomplete or from a "
                              "converter this project does not know (convert the original model with mlx-lm)")
        return v

    if value(metadata, f"{a}.expert_count", 0):
        raise ConfigError(f"GGUF '{where}' is a mixture of experts, which this converter does not map: "
                          "use an mlx-lm folder of the model instead")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(value(metadata, f"{a}.attention.key_length", hidden // heads))
    rotary = int(value(metadata, f"{a}.rope.dimension_count", head_dim))
    config = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(value(metadata, f"{a}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        # The embedding's rows are the vocabulary the weights were trained with.
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "max_position_embeddings": int(need("context_length")),
        "rope_theta": float(value(metadata, f"{a}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if rotary != head_dim and arch.model_type != "phi3":
        raise ConfigError(f"GGUF '{where}' rotates {rotary} of {head_dim} head dimensions (partial rope), which "
                          f"mlx-lm's {arch.model_type} does not: use an mlx-lm folder of the model instead")
    scaling = rope_scaling(metadata, tensors, a, config, where)
    if scaling:
        config["rope_scaling"] = scaling
    if arch.model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if arch.model_type == "gemma3_text":
        config.update(gemma3_extras(metadata, a, config))
    if arch.model_type == "phi3":
        config["partial_rotary_factor"] = rotary / head_dim
        config["original_max_position_embeddings"] = int(
            value(metadata, f"{a}.rope.scaling.original_context_length", config["max_position_embeddings"]))
    for key in ("bos_token_id", "eos_token_id"):
        token = value(metadata, f"tokenizer.ggml.{key}")
        if token is not None:
            config[key] = int(token)
    return config


def gemma3_extras(metadata: dict, a: str, config: dict) -> dict:
    """What Gemma 3's GGUF leaves implicit, as llama.cpp fills it in (src/llama-model.cpp)."""
    layers = config["num_hidden_layers"]
    # llama.cpp: the 27B model scales queries by (hidden / heads)^-0.5, the others by head_dim^-0.5.
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == GEMMA3_27B_LAYERS else config["head_dim"]
    return {"query_pre_attn_scalar": scalar, "sliding_window": int(value(metadata, f"{a}.attention.sliding_window", 512)),
            "sliding_window_pattern": GEMMA3_PATTERN, "rope_local_base_freq": GEMMA3_LOCAL_BASE}


def rope_scaling(metadata: dict, tensors: dict, a: str, config: dict, where: str) -> dict | None:
    """mlx-lm's `rope_scaling` for the file's rope keys and factor tensors, None for plain rope."""
    kind = value(metadata, f"{a}.rope.scaling.type", "none")
    if "rope_freqs.weight" in tensors:  # Llama 3.1+: llama.cpp stores the per-frequency factors
        return llama3_scaling(factors(tensors["rope_freqs.weight"]), config, metadata, a, where)
    if "rope_factors_long.weight" in tensors:
        # Phi-3 128k: llama.cpp switches between the short and long factors by context length,
        # mlx-lm's SuScaledRoPE always applies the long ones: not the same model at short contexts.
        raise ConfigError(f"GGUF '{where}' uses LongRoPE (Phi-3 128k), which mlx-lm runs differently from "
                          "llama.cpp at short contexts: use the 4k variant or an mlx-lm folder of the model")
    if kind == "none":
        return None
    factor = value(metadata, f"{a}.rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    raise ConfigError(f"GGUF '{where}' uses '{kind}' rope scaling, which this converter does not map: "
                      "use an mlx-lm folder of the model instead")


def factors(tensor) -> np.ndarray:
    return np.asarray(tensor.raw, dtype=np.float64).reshape(-1)


def llama3_scaling(freqs: np.ndarray, config: dict, metadata: dict, a: str, where: str) -> dict:
    """Llama 3's rope scaling, recovered from the factors llama.cpp computed from it.

    llama.cpp's converter stores one factor per frequency: 1 for short wavelengths, `factor`
    for long ones and 1 / ((1 - s) / factor + s) between, with s = (orig / wavelength - low) /
    (high - low). Between the two bands s is linear in 1 / wavelength, so two middle factors
    fix it; low = 1 (Llama 3's value) or the file's original context picks one of the
    equivalent (orig, low, high). The fit is checked by recomputing every factor."""
    dims, theta = config["head_dim"], config["rope_theta"]
    wavelen = 2 * np.pi * theta ** (np.arange(0, dims, 2) / dims)
    factor = float(freqs.max())
    middle = (freqs > 1 + 1e-6) & (freqs < factor * (1 - 1e-6))
    orig = value(metadata, f"{a}.rope.scaling.original_context_length")
    fit = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": int(orig or 8192)}
    if middle.sum() >= 2 and factor > 1:
        s = (1 / freqs[middle] - 1 / factor) / (1 - 1 / factor)
        (slope, offset), *_ = np.linalg.lstsq(np.stack([1 / wavelen[middle], -np.ones(middle.sum())], 1), s, rcond=None)
        if orig:
            width = orig / slope
            fit = {"low_freq_factor": offset * width, "high_freq_factor": (1 + offset) * width,
                   "original_max_position_embeddings": int(orig)}
        else:
            fit = {"low_freq_factor": 1.0, "high_freq_factor": 1 + 1 / offset,
                   "original_max_position_embeddings": int(round(slope / offset))}
    scaling = {"rope_type": "llama3", "factor": factor, **fit}
    if len(freqs) != len(wavelen) or not np.allclose(llama3_factors(scaling, wavelen), freqs, rtol=1e-4, atol=0):
        raise ConfigError(f"GGUF '{where}' has rope_freqs that no Llama 3 rope scaling reproduces: "
                          "use an mlx-lm folder of the model instead")
    return scaling


def llama3_factors(scaling: dict, wavelen: np.ndarray) -> np.ndarray:
    """The per-frequency factors of a Llama 3 `rope_scaling`, as llama.cpp's converter computes them."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    smooth = (orig / wavelen - low) / (high - low)
    out = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, 0.0))
    middle = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(middle, 1 / ((1 - smooth) / factor + smooth), out)
