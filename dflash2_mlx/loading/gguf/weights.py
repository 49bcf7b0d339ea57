"""GGUF tensors renamed to mlx-lm's, llama's q/k rows put back, quantization recorded."""

import mlx.core as mx

from ...errors import CheckpointError
from .config import SHARED, Architecture

GROUP_SIZE = 32  # every GGUF block type MLX reads packs 32 values per scale
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_PARTS = ("weight", "bias", "scales", "biases")


def module_name(gguf_module: str) -> str | None:
    """mlx-lm's name of a GGUF module (`blk.3.attn_q` -> `model.layers.3.self_attn.q_proj`), None if unknown."""
    if gguf_module in _TOP:
        return _TOP[gguf_module]
    parts = gguf_module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}"
    return None


def check_complete(tensors: dict, arch: Architecture, layers: int, where: str) -> None:
    """One line naming the first tensor missing for this architecture."""
    needed = ["token_embd.weight", "output_norm.weight"]
    needed += [f"blk.{i}.{s}" for i in range(layers) for s in SHARED + arch.extra]
    for name in needed:
        if name not in tensors:
            raise CheckpointError(f"GGUF '{where}' has no tensor '{name}': it is not a complete "
                                  f"{arch.model_type} file (download or convert it again)")


def unpermute_rows(x: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's `permute` of q/k rows: per head it stored the rope pairs
    (i, i + D/2) next to each other (interleaved); mlx-lm's llama, like the HF
    checkpoint, rotates halves. Rows only move, so packed weights, scales and
    biases all take the same permutation."""
    rows = x.shape[0]
    rest = x.shape[1:]
    return x.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def mlx_lm_weights(tensors: dict, arch: Architecture, config: dict, where: str) -> tuple[dict, dict]:
    """(weights under mlx-lm's names, config.json's "quantization" or {}).

    Quantized tensors come from `mx.load` as MLX affine triples of 32-value
    groups; the bits are read per tensor (a file may mix 8-bit and 4-bit)."""
    out, bits = {}, {}
    for name, x in tensors.items():
        gguf_module, _, part = name.rpartition(".")
        module = module_name(gguf_module)
        if module is None or part not in _PARTS:
            raise CheckpointError(f"GGUF '{where}' has tensor '{name}', which a plain {arch.model_type} file does "
                                  "not: this converter does not know what it is for")
        if arch.permuted_qk and gguf_module.split(".")[-1] in ("attn_q", "attn_k"):
            heads = config["num_attention_heads"] if gguf_module.endswith("attn_q") else config["num_key_value_heads"]
            x = unpermute_rows(x, heads)
        if x.dtype == mx.float16 and not mx.isfinite(x).all().item():
            # MLX reads BF16 (and dequantizes other types) as float16, whose range is far smaller.
            raise CheckpointError(f"GGUF '{where}' tensor '{name}' holds values float16 cannot (MLX reads BF16 "
                                  "tensors as float16): use an F16, Q8_0 or Q4 file, or an mlx-lm folder")
        if part == "weight" and f"{gguf_module}.scales" in tensors:
            scales = tensors[f"{gguf_module}.scales"]
            bits[module] = x.shape[-1] // scales.shape[-1]
        out[f"{module}.{part}"] = x
    return out, quantization(bits)


def quantization(bits: dict[str, int]) -> dict:
    """mlx-lm's config entry: the commonest bits at the top, other modules by name."""
    if not bits:
        return {}
    counts: dict[int, int] = {}
    for b in bits.values():
        counts[b] = counts.get(b, 0) + 1
    top = max(counts, key=counts.get)
    entry = {"group_size": GROUP_SIZE, "bits": top, "mode": "affine"}
    for module, b in sorted(bits.items()):
        if b != top:
            entry[module] = {"group_size": GROUP_SIZE, "bits": b, "mode": "affine"}
    return entry
