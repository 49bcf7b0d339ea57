"""The drafter MLP's gate activation, by the `hidden_act` name transformers uses.

The MLP is `down(act(gate(x)) * up(x))` (transformers' Qwen3MLP with
`ACT2FN[hidden_act]`). Only names whose MLX function is the same formula are
listed; a config naming another one is refused by name (config.py), never
silently run as SiLU.
"""

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

# transformers ACT2FN name -> the same function in MLX.
ACTIVATIONS = {
    "silu": nn.silu,
    "swish": nn.silu,
    "gelu": nn.gelu,  # erf form
    "gelu_pytorch_tanh": nn.gelu_approx,  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
    "gelu_new": nn.gelu_approx,
    "gelu_fast": nn.gelu_approx,  # the same tanh form, factored differently
    "quick_gelu": nn.gelu_fast_approx,  # x·sigmoid(1.702·x)
    "relu": nn.relu,
}


def gated(name: str, gate: mx.array, up: mx.array) -> mx.array:
    """act(gate) * up; SiLU through mlx-lm's fused `swiglu`, as before."""
    if name in ("silu", "swish"):
        return swiglu(gate, up)
    return ACTIVATIONS[name](gate) * up
