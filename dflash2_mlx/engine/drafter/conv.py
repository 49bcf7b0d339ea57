"""DFlash 2's two-tap dynamic depthwise convolution (docs/algorithm.md §2).

`two_tap_conv` is the one entry point: it runs the fused Metal kernel when one
is active (`kernels/registry.py`) and the plain-MLX twin below otherwise. The twin is
the specification the kernel is tested against.
"""

import mlx.core as mx
import mlx.nn as nn

from ...kernels import metal_cuda, registry


def two_tap_conv_ops(x: mx.array, delta: mx.array, base: mx.array, group_size: int) -> mx.array:
    """Plain-MLX two-tap convolution over blocks.

    x: [N, B, H], one block per leading row (the shift never crosses blocks).
    delta: [N, B, 2, G] per-row corrections (tap-major), G = H // group_size.
    base: [2, H] base kernel for this side (tap 0 = current row, tap 1 = previous).
    Row 0 of every block reads zeros for its previous row.
    """
    N, B, H = x.shape
    G = H // group_size
    xg = x.reshape(N, B, G, group_size)
    prev = mx.concatenate([mx.zeros_like(xg[:, :1]), xg[:, :-1]], axis=1)
    coef = base.reshape(2, G, group_size).astype(x.dtype) + delta.astype(x.dtype)[..., None]
    y = coef[:, :, 0] * xg + coef[:, :, 1] * prev
    return y.reshape(N, B, H)


def two_tap_conv(x: mx.array, delta: mx.array, base: mx.array, group_size: int) -> mx.array:
    """Two-tap block-local convolution; fused kernel when active, else the twin."""
    kernel = registry.active("two_tap_conv", agrees_with_twin)
    if kernel is not None:
        return kernel(x, delta, base, group_size)
    return two_tap_conv_ops(x, delta, base, group_size)


def agrees_with_twin(kernel) -> None:
    """Raise unless `kernel` matches the twin on a small fixed problem (run once
    when a fused kernel is built)."""
    problem = metal_cuda.conv_check_problem()
    if not mx.allclose(kernel(*problem), two_tap_conv_ops(*problem), rtol=1e-5, atol=1e-5).item():
        raise RuntimeError("disagrees with conv.two_tap_conv_ops")



class TwoTapConv(nn.Module):
    """`attention_conv` / `mlp_conv`: wraps one sublayer on both sides.

    `base_kernel` [side, tap, H] starts at identity (tap 0 = 1, tap 1 = 0) and
    `kernel_projection` at zero, so an untrained conv is exactly the identity.
    """

    def __init__(self, hidden_size: int, group_size: int):
        super().__init__()
        self.group_size = group_size
        groups = hidden_size // group_size
        base = mx.zeros((2, 2, hidden_size))
        self.base_kernel = base.at[:, 0, :].add(1.0)
        self.kernel_projection = nn.Linear(hidden_size, 2 * 2 * groups, bias=False)
        self.kernel_projection.weight = mx.zeros_like(self.kernel_projection.weight)

    def corrections(self, x: mx.array) -> mx.array:
        """Per-row corrections from the sublayer input: [N, B, side, tap, G]."""
        N, B, _ = x.shape
        return self.kernel_projection(x).reshape(N, B, 2, 2, -1)

    def __call__(self, x: mx.array, corrections: mx.array, side: int) -> mx.array:
        return two_tap_conv(x, corrections[:, :, side], self.base_kernel[side], self.group_size)
