"""Kernel-versus-twin comparisons and their inputs.

The real tests and the mutation tests call the same `assert_*` functions, so
a mutation test that sees them fail shows that the real tests would too.

Tolerances (the why is next to each):
* conv: |kernel - twin| <= 8 * u_T * ((|b0|+|d0|)*|x[t]| + (|b1|+|d1|)*|x[t-1]|) + 1e-6,
  u_T the unit roundoff of x's dtype (2^-24 f32, 2^-11 f16, 2^-9 bf16), b/d the
  base and correction of each tap.
* path: picks and greedy q rows exactly equal; sampled q rows within
  rtol 1e-5, atol 1e-7.
"""

from __future__ import annotations

from typing import Callable, Optional

import mlx.core as mx
import numpy as np

from dflash2_mlx.engine.drafter.conv import two_tap_conv_ops
from dflash2_mlx.engine.drafter.selector import path_select_ops

# The twin rounds the coefficient, both products and the sum to T (and the base
# on its cast); the kernel computes in fp32 and rounds once. Their gap is a few
# roundings of the terms' size, and 8 of them leaves room for an FMA on a GPU.
UNIT_ROUNDOFF = {mx.float32: 2.0**-24, mx.float16: 2.0**-11, mx.bfloat16: 2.0**-9}
CONV_ROUNDINGS = 8
CONV_ATOL = 1e-6
# Softmax rows: exp differs by a few ulps between libm, Metal and MLX's CPU exp,
# and the normaliser's sum order differs (MLX sums in SIMD lanes).
Q_RTOL = 1e-5
Q_ATOL = 1e-7
# A uniform closer than this to a CDF step is a coin flip that rounding decides
# differently on each backend, so the sampled tests redraw it (see sampled_uniforms).
CDF_MARGIN = 1e-5


def _np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)) if a.dtype in (mx.bfloat16, mx.float16) else np.array(a)


def conv_inputs(seed: int, N: int, B: int, H: int, group_size: int, dtype=mx.float32, base_dtype=None):
    """Random (x, delta, base, group_size) for the conv."""
    rng = np.random.default_rng(seed)
    G = H // group_size
    x = mx.array(rng.standard_normal((N, B, H), dtype=np.float32)).astype(dtype)
    delta = mx.array(0.3 * rng.standard_normal((N, B, 2, G), dtype=np.float32)).astype(dtype)
    base = mx.array(rng.standard_normal((2, H), dtype=np.float32)).astype(base_dtype or dtype)
    return x, delta, base, group_size


def assert_conv_matches(fn: Callable, x, delta, base, group_size) -> None:
    """`fn` agrees with `two_tap_conv_ops` within the conv tolerance above."""
    got = fn(x, delta, base, group_size)
    want = two_tap_conv_ops(x, delta, base, group_size)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    # Size of the two terms, in float64, from the exact inputs.
    N, B, H = x.shape
    x64, d64, b64 = (_np(a).astype(np.float64) for a in (x, delta, base))
    d64 = np.repeat(d64, group_size, axis=-1)  # [N, B, 2, H]
    # The twin rounds base and coefficient separately, so a coefficient that
    # cancels (base ~ -delta) carries the rounding of |base| + |delta|, not of itself.
    m0, m1 = np.abs(b64[0]) + np.abs(d64[:, :, 0]), np.abs(b64[1]) + np.abs(d64[:, :, 1])
    prev = np.concatenate([np.zeros_like(x64[:, :1]), x64[:, :-1]], axis=1)
    tol = CONV_ROUNDINGS * UNIT_ROUNDOFF[x.dtype] * (m0 * np.abs(x64) + m1 * np.abs(prev)) + CONV_ATOL
    diff = np.abs(_np(got).astype(np.float64) - _np(want).astype(np.float64))
    bad = ~(diff <= tol)  # NaN (an element never written) counts as bad
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"conv: {int(bad.sum())} of {bad.size} elements outside tolerance; first at {i}: "
            f"kernel {_np(got)[i]!r}, twin {_np(want)[i]!r}, tol {tol[i]:.3g}")


def path_inputs(seed: int, N: int, K: int, R: int, V: int, dtype=mx.float32, integer: bool = False):
    """Random positional arguments of `path_select_ops`.

    `integer=True` draws small integers, which makes every score exact in any
    summation order and makes ties in the lattice common.
    """
    rng = np.random.default_rng(seed)
    if integer:
        unary = rng.integers(-2, 3, (N, K)).astype(np.float32)
        gate = rng.integers(-1, 2, (N, R)).astype(np.float32)
        A = rng.integers(-1, 2, (V, R)).astype(np.float32)
        B = rng.integers(-1, 2, (V, R)).astype(np.float32)
    else:
        unary = 2.0 * rng.standard_normal((N, K), dtype=np.float32)
        gate = rng.standard_normal((N, R), dtype=np.float32)
        A = rng.standard_normal((V, R), dtype=np.float32) / np.sqrt(R)
        B = rng.standard_normal((V, R), dtype=np.float32)
    pred_ids = rng.integers(0, V, (N, K)).astype(np.int32)
    cand_ids = rng.integers(0, V, (N, K)).astype(np.int32)
    return (mx.array(unary), mx.array(pred_ids), mx.array(cand_ids), mx.array(gate).astype(dtype),
            mx.array(A).astype(dtype), mx.array(B).astype(dtype))


def lattice64(args) -> np.ndarray:
    """S[t, p, c] in float64 from the exact inputs."""
    unary, pred_ids, cand_ids, gate, A, B = args
    unary, gate, A, B = (_np(a).astype(np.float64) for a in (unary, gate, A, B))
    pred_ids, cand_ids = np.array(pred_ids), np.array(cand_ids)
    pair = np.einsum("tpr,tr,tcr->tpc", A[pred_ids], gate, B[cand_ids])
    return unary[:, None, :] + pair


def path_rows(args, picks) -> np.ndarray:
    """The lattice rows S_t[i_{t-1}, :] the walk `picks` read, float64 [N, K]."""
    S = lattice64(args)
    prev = np.concatenate([[0], np.array(picks)[:-1]]).astype(int)
    return S[np.arange(S.shape[0]), prev]


def greedy_gap(args) -> float:
    """Smallest gap between the best and second-best score along the twin's greedy path."""
    picks, _ = path_select_ops(*args)
    rows = np.sort(path_rows(args, picks), axis=-1)
    return float(np.min(rows[:, -1] - rows[:, -2]))


def sampled_uniforms(args, temperature: float, seed: int) -> mx.array:
    """Uniforms at least CDF_MARGIN away from every CDF step on the twin's path."""
    N = args[0].shape[0]
    rng = np.random.default_rng(seed)
    u = rng.random(N).astype(np.float32)
    for _ in range(100):
        _, q = path_select_ops(*args, temperature=temperature, uniforms=mx.array(u))
        cdf = np.cumsum(np.array(q, dtype=np.float64), axis=-1)
        close = np.min(np.abs(cdf - u[:, None].astype(np.float64)), axis=-1) < CDF_MARGIN
        if not close.any():
            return mx.array(u)
        t = int(np.argmax(close))  # the first close one decides the rest of the path
        u[t] = rng.random()
    raise AssertionError("could not draw uniforms away from the CDF steps")


def assert_path_matches(fn: Callable, args, temperature: float = 0.0,
                        uniforms: Optional[mx.array] = None) -> None:
    """`fn` agrees with `path_select_ops`: picks exactly, q rows as stated above."""
    picks, q = fn(*args, temperature=temperature, uniforms=uniforms)
    want_picks, want_q = path_select_ops(*args, temperature=temperature, uniforms=uniforms)
    assert picks.dtype == mx.int32 and q.dtype == mx.float32, (picks.dtype, q.dtype)
    np.testing.assert_array_equal(np.array(picks), np.array(want_picks), err_msg="picks differ from the twin")
    if temperature == 0:
        np.testing.assert_array_equal(np.array(q), np.array(want_q), err_msg="greedy q rows differ")
    else:
        np.testing.assert_allclose(np.array(q), np.array(want_q), rtol=Q_RTOL, atol=Q_ATOL,
                                   err_msg="sampled q rows differ")


# Rows whose fp32 softmax CDF ends below 1 (at 1 - 2^-23), found by search: a few
# finite scores, the rest at -300 where exp underflows to exactly 0. With the
# largest float32 uniform below 1 (U_TOP) the inverse CDF runs off the end.
U_TOP = np.nextafter(np.float32(1), np.float32(0))
CDF_EDGE_ROWS = [
    [2.899937629699707, -1.042000651359558, -1.084018349647522],
    [-0.9436262845993042, 2.75590181350708, 0.27146145701408386],
    [4.004785060882568, 0.3770383894443512, -1.266388177871704, -0.7551270127296448, -2.1822922229766846],
]


def cdf_edge_inputs(finite, K: int = 16):
    """(args, uniforms) of `path_select_ops` whose every lattice row is `finite`
    then -300s (gate 0: the pair term vanishes, so S_t[p, :] is the unary row)."""
    unary = np.full((1, K), -300.0, np.float32)
    unary[0, : len(finite)] = finite
    ids = mx.zeros((1, K), mx.int32)
    args = (mx.array(unary), ids, ids, mx.zeros((1, 8)), mx.zeros((4, 8)), mx.zeros((4, 8)))
    return args, mx.array(np.array([U_TOP], np.float32))


def fp32_cdf_end(q) -> np.float32:
    """The last entry of a q row's CDF, summed left to right in float32."""
    return np.cumsum(np.array(q, np.float32).reshape(-1), dtype=np.float32)[-1]
