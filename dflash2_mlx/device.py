"""Facts about the machine MLX runs on (the ground floor: imports nothing of ours)."""

import mlx.core as mx


def backend_name() -> str:
    """'metal', 'cuda' or 'cpu': the backend MLX computes on here."""
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return "cpu"


def default_activation_dtype() -> mx.Dtype:
    """fp32 on the CPU (bf16/fp16 and quantized-with-bf16 paths are many times
    slower there); bf16 elsewhere (fp16 overflows DFlash residuals)."""
    return mx.float32 if backend_name() == "cpu" else mx.bfloat16
