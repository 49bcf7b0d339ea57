"""A GGUF file's metadata as the mlx-lm config.json of its architecture."""

from dataclasses import dataclass

from ...errors import ConfigError


@dataclass(frozen=True)
class Architecture:
    """How one `general.architecture` maps to an mlx-lm model."""

    model_type: str
    # llama.cpp's converter reorders llama's q/k rows for its interleaved rope (weights.py undoes it).
    permuted_qk: bool
    # GGUF tensor suffixes every block must have, beyond the ones all three share.
    extra: tuple[str, ...] = ()


SHARED = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
ARCHITECTURES = {
    "llama": Architecture("llama", permuted_qk=True),
    "qwen2": Architecture("qwen2", permuted_qk=False, extra=("attn_q.bias", "attn_k.bias", "attn_v.bias")),
    "qwen3": Architecture("qwen3", permuted_qk=False, extra=("attn_q_norm.weight", "attn_k_norm.weight")),
}


def value(metadata: dict, key: str, default=None):
    """A metadata value as a Python scalar (mx.load gives numbers as 0-d arrays)."""
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

    scaling = value(metadata, f"{a}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensors:
        raise ConfigError(f"GGUF '{where}' uses rope scaling ({'rope_freqs' if scaling == 'none' else scaling}), "
                          "which this converter does not map: use an mlx-lm folder of the model instead")
    if value(metadata, f"{a}.expert_count", 0):
        raise ConfigError(f"GGUF '{where}' is a mixture of experts, which this converter does not map: "
                          "use an mlx-lm folder of the model instead")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(value(metadata, f"{a}.attention.key_length", hidden // heads))
    rotary = int(value(metadata, f"{a}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ConfigError(f"GGUF '{where}' rotates {rotary} of {head_dim} head dimensions (partial rope), which "
                          f"mlx-lm's {arch.model_type} does not: use an mlx-lm folder of the model instead")
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
    if arch.model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    for key in ("bos_token_id", "eos_token_id"):
        token = value(metadata, f"tokenizer.ggml.{key}")
        if token is not None:
            config[key] = int(token)
    return config
