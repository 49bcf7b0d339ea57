"""GGUF tensors renamed to mlx-lm's, repacked as MLX quantization, the converter's changes undone."""

import mlx.core as mx

from ...errors import CheckpointError
from .config import Architecture
from .read import Tensor
from .repack import FLOAT_TYPES, GROUP_SIZE, SUPPORTED, float_tensor, repack

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_PARTS = ("weight", "bias")


def module_name(gguf_module: str, arch: Architecture) -> str | None:
    """mlx-lm's name of a GGUF module (`blk.3.attn_q` -> `model.layers.3.self_attn.q_proj`), None if unknown."""
    if gguf_module in _TOP:
        return _TOP[gguf_module]
    parts = gguf_module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        name = arch.names.get(parts[2]) or _BLOCK.get(parts[2])
        return f"model.layers.{parts[1]}.{name}" if name else None
    return None


def check_complete(tensors: dict, arch: Architecture, layers: int, where: str) -> None:
    """One line naming the first tensor missing for this architecture."""
    needed = ["token_embd.weight", "output_norm.weight"] + [f"blk.{i}.{s}" for i in range(layers) for s in arch.block]
    for name in needed:
        if name not in tensors:
            raise CheckpointError(f"GGUF '{where}' has no tensor '{name}': it is not a complete "
                                  f"{arch.model_type} file (download or convert it again)")


def check_types(tensors: dict[str, Tensor], where: str) -> None:
    """Refuse, before any work, a file holding a type with no faithful MLX home (IQ, ternary, …)."""
    for t in tensors.values():
        if t.kind not in SUPPORTED:
            raise CheckpointError(
                f"GGUF '{where}' holds {t.kind} tensors (first: '{t.name}'), which this converter does not read "
                f"(it reads {', '.join(SUPPORTED)}): use a Q4_K_M, Q5_K_M, Q6_K or Q8_0 file of the model")


def unpermute_rows(x: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's `permute` of q/k rows: per head it stored the rope pairs
    (i, i + D/2) next to each other (interleaved); mlx-lm's llama, like the HF
    checkpoint, rotates halves. Rows only move, so packed weights, scales and
    biases all take the same permutation."""
    rows = x.shape[0]
    rest = x.shape[1:]
    return x.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def mlx_lm_weights(tensors: dict[str, Tensor], arch: Architecture, config: dict, where: str) -> tuple[dict, dict]:
    """(weights under mlx-lm's names, config.json's "quantization" or {}).

    Quantized tensors become MLX affine triples of 32-value groups (repack.py); the bits are
    per tensor (a Q4_K_M file mixes 4, 5 and 8 bits: Q4_K, Q5_0, Q6_K)."""
    out, bits = {}, {}
    for name, t in tensors.items():
        if name in arch.config_tensors:
            continue
        gguf_module, _, part = name.rpartition(".")
        module = module_name(gguf_module, arch)
        if module is None or part not in _PARTS:
            raise CheckpointError(f"GGUF '{where}' has tensor '{name}', which a plain {arch.model_type} file does "
                                  "not: this converter does not know what it is for")
        short = gguf_module.split(".")[-1]
        heads = None
        if arch.permuted_qk and short in ("attn_q", "attn_k"):
            heads = config["num_attention_heads"] if short == "attn_q" else config["num_key_value_heads"]
        if t.kind in FLOAT_TYPES or part == "bias":
            x = float_tensor(t.kind, t.raw).reshape(t.shape)
            if arch.norm_offset and short.endswith("norm"):
                x = (x.astype(mx.float32) - arch.norm_offset).astype(x.dtype)
            out[f"{module}.{part}"] = unpermute_rows(x, heads) if heads else x
            continue
        packed = repack(t.kind, t.raw.reshape(t.rows, -1), t.shape[-1])
        for suffix, x in (("weight", packed.weight), ("scales", packed.scales), ("biases", packed.biases)):
            out[f"{module}.{suffix}"] = unpermute_rows(x, heads) if heads else x
        bits[module] = packed.bits
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
