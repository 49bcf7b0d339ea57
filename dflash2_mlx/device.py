"""Facts about the machine MLX runs on (the ground floor: imports nothing of ours)."""

import os
from typing import Optional

import mlx.core as mx


def backend_name() -> str:
    """'metal', 'cuda' or 'cpu': the backend MLX computes on here."""
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return "cpu"


def default_activation_dtype() -> mx.Dtype:
    """The drafter's dtype when none is asked for: fp32 on the CPU (its bf16
    one-row passes are slower there); bf16 elsewhere (fp16 overflows DFlash
    residuals)."""
    return mx.float32 if backend_name() == "cpu" else mx.bfloat16


def target_activation_dtype(stored: mx.Dtype, quantized: bool, experts: bool = False) -> mx.Dtype:
    """The target's dtype when none is asked for (docs/long-context.md, measured by
    benchmarks/long_context/prefill_policy.py). On the CPU a dense unquantized target keeps its
    checkpoint's `stored` float dtype, as mlx-lm runs it: an fp32 upcast
    prefilled slower than mlx-lm and held twice its weights. A quantized one
    computes in fp32 there (bf16 scales take a path many times slower, and only
    its scales and norms grow), and so does one with mixture-of-experts layers
    (`experts`: the CPU's gather_mm runs float32 only). bf16 on the other backends."""
    if backend_name() != "cpu":
        return mx.bfloat16
    return mx.float32 if quantized or experts else stored


# Prompt tokens per target forward during prefill on the CPU (docs/long-context.md,
# benchmarks/long_context/prefill_policy.py): a smaller chunk keeps attention's score rows small.
CPU_PREFILL_STEP_SIZE = 512


def default_prefill_step_size() -> int:
    """Prompt tokens per prefill chunk when none is asked for: CPU_PREFILL_STEP_SIZE
    on the CPU, mlx-lm's 2048 on the other backends."""
    return CPU_PREFILL_STEP_SIZE if backend_name() == "cpu" else 2048


def device_memory_bytes() -> Optional[int]:
    """What the models must fit in: the GPU's recommended working set, or RAM."""
    try:
        info = dict(mx.device_info())
    except Exception:  # older MLX
        info = {}
    for key in ("max_recommended_working_set_size", "memory_size"):
        if info.get(key):
            return int(info[key])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
