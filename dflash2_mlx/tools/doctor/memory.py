"""The memory section, before loading anything: weights read from safetensors
headers, KV caches from config.json, their total against the device's memory."""

import json
import math
import struct
from pathlib import Path
from typing import Optional

from ...errors import DFlashError
from ...device import device_memory_bytes
from .report import Finding, Section

GB = 1e9
_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
_ACT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def safetensors_header(path: Path) -> dict:
    """Tensor name -> {dtype, shape, data_offsets}, read without the weights."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise DFlashError(f"'{path}' is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise DFlashError(f"'{path}' is not a safetensors file (header size {n})")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def weight_bytes(folder: Path, act_bytes: int, quant=None) -> int:
    """Bytes the weights take once loaded: float tensors in the activation
    dtype, packed quantized ones as stored; with `quant` (a DraftQuant), 2-D
    weights as they would be quantized (codebooks at 8 bits or more)."""
    from ...loading.quantize import CODEBOOK_MIN_BITS

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        for name, t in safetensors_header(f).items():
            count = 1
            for d in t["shape"]:
                count *= d
            stored = t["data_offsets"][1] - t["data_offsets"][0]
            if t["dtype"] not in _FLOAT_BYTES:
                total += stored
            elif quant is not None and len(t["shape"]) == 2 and t["shape"][-1] % quant.group_size == 0:
                bits = max(quant.bits, CODEBOOK_MIN_BITS) if "codebook" in name else quant.bits
                total += count * bits // 8 + 2 * (count // quant.group_size) * act_bytes
            else:
                total += count * act_bytes
    return total


def size_text(gigabytes: float) -> str:
    return f"{gigabytes:.2f} GB" if gigabytes >= 0.1 else f"{gigabytes * 1e3:.1f} MB"


def text_config(config: dict) -> dict:
    return config.get("text_config") or config


def kv_bytes_per_token(config: dict, act_bytes: int, context: int, extra_rows: int = 16) -> float:
    """Average KV bytes per context token (sliding layers stop growing at their
    window; recurrent layers have a fixed state, not counted)."""
    c = text_config(config)
    n_layers = c["num_hidden_layers"]
    heads = c.get("num_attention_heads", 1)
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    types = c.get("layer_types")
    if not types and c.get("full_attention_interval"):
        k = c["full_attention_interval"]
        types = ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n_layers)]
    types = types or ["full_attention"] * n_layers
    window = c.get("sliding_window") or context
    rows = 0
    for kind in types:
        if kind == "sliding_attention":
            rows += min(context, window + extra_rows)
        elif kind in ("full_attention", "attention"):
            rows += context
    return 2 * kv_heads * head_dim * act_bytes * rows / max(context, 1)


_MX_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def target_activation(folder: Path, config: dict) -> str:
    """The dtype `load_target` will give this target (device.target_activation_dtype),
    read from its config and safetensors headers without loading it."""
    import mlx.core as mx

    from ...device import target_activation_dtype
    from ...loading.checkpoints import majority_dtype

    stored = majority_dtype((getattr(mx, _MX_FLOATS[t["dtype"]]), math.prod(t["shape"]))
                            for f in sorted(Path(folder).glob("*.safetensors"))
                            for t in safetensors_header(f).values() if t["dtype"] in _MX_FLOATS)
    c = text_config(config)
    experts = any(c.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    quantized = bool(config.get("quantization") or config.get("quantization_config"))
    return str(target_activation_dtype(stored, quantized, experts)).split(".")[-1]


def memory_estimate(target_folder: Path, drafter_folder: Optional[Path], context: int,
                    draft_quant=None, act_dtype: Optional[str] = None) -> Section:
    from ...device import default_activation_dtype
    from ...loading.checkpoints import read_config

    t_config = read_config(Path(target_folder), "target")
    # The target's dtype follows the load policy; the drafter's is the backend's default.
    act = act_dtype or target_activation(Path(target_folder), t_config)
    act_bytes = _ACT_BYTES[act]
    drafter_act = act_dtype or str(default_activation_dtype()).split(".")[-1]
    data = {"context_tokens": context, "activation_dtype": act,
            "target_weights_gb": weight_bytes(target_folder, act_bytes) / GB,
            "target_kv_gb": kv_bytes_per_token(t_config, act_bytes, context) * context / GB}
    findings = [
        Finding("target weights", "info", f"{size_text(data['target_weights_gb'])} ({act} activations)"),
        Finding("target KV cache", "info", f"{size_text(data['target_kv_gb'])} for {context:,} tokens"),
    ]
    if drafter_folder is not None:
        d_config = read_config(Path(drafter_folder), "drafter")
        d_act = drafter_act
        if draft_quant is not None:
            d_act = str(draft_quant.activation_dtype).split(".")[-1]
        d_bytes = _ACT_BYTES[d_act]
        data["drafter_weights_gb"] = weight_bytes(drafter_folder, d_bytes, draft_quant) / GB
        data["drafter_kv_gb"] = kv_bytes_per_token(d_config, d_bytes, context) * context / GB
        quant_note = f", quantized {draft_quant}" if draft_quant is not None else ""
        findings += [
            Finding("drafter weights", "info", f"{size_text(data['drafter_weights_gb'])} ({d_act} activations{quant_note})"),
            Finding("drafter KV cache", "info", f"{size_text(data['drafter_kv_gb'])} for {context:,} tokens of context"),
        ]
    total = sum(v for k, v in data.items() if k.endswith("_gb"))
    data["total_gb"] = total
    limit = device_memory_bytes()
    data["device_memory_gb"] = limit / GB if limit else None
    if limit is None:
        findings.append(Finding("total", "info", f"{size_text(total)} (estimate; device memory unknown)"))
    elif total * GB > limit:
        findings.append(Finding("total", "fail", f"{size_text(total)} does not fit in {limit / GB:.1f} GB: use a "
                                                 "quantized target, a smaller context, or --draft-quant"))
    elif total * GB > 0.75 * limit:
        findings.append(Finding("total", "warn", f"{size_text(total)} is over 75 % of {limit / GB:.1f} GB: expect "
                                                 "memory pressure"))
    else:
        findings.append(Finding("total", "ok", f"{size_text(total)} of {limit / GB:.1f} GB (estimate, before loading)"))
    return Section("Memory (estimated before loading)", tuple(findings), data)
