"""Fused Metal and CUDA kernels for the two-tap conv and the path walk.

The bodies live in `metal/*.metal` (package `dflash2_mlx.metal`). They run on
Metal through `mx.fast.metal_kernel`, and unchanged on MLX's CUDA backend
through `mx.fast.cuda_kernel` with `cuda_compat.h` as the header.

`build_kernel` wraps a factory for one kernel name and runs the caller's
agreement check (the op module's twin on a small fixed problem); where building
fails, the first call fails, or the kernel disagrees with its twin, it warns
once and returns None: callers then use the twin, never crash. This module
knows no op module: the twins live beside their ops (engine/drafter/conv.py,
engine/drafter/selector.py), which hand their checks to `registry.active`.

`conv_kernel` and `path_select_kernel` turn a factory with the arguments of
`mx.fast.metal_kernel` into a callable with the twin's signature; the tests
hand them a CPU harness instead of MLX's factory.
"""

import warnings
from typing import Callable, Optional

import mlx.core as mx
import numpy as np


# Threads per threadgroup. The conv is elementwise; the path kernel is one
# threadgroup whose threads share the K*K*N scores before thread 0 walks.
CONV_THREADS = 256
PATH_THREADS = 256


def _read_body(name: str) -> str:
    # Imported here so a checkout without the installed package-data mapping
    # still imports the library (the builder then warns and uses the twin).
    from ..metal import read_body

    return read_body(name)


def conv_kernel(factory: Callable, header: str = "") -> Callable:
    """Fused `two_tap_conv(x, delta, base, group_size)` built with `factory`."""
    kernel = factory(
        name="dflash2_two_tap_conv",
        input_names=["x", "delta", "base"],
        output_names=["y"],
        source=_read_body("two_tap_conv"),
        header=header,
    )

    def two_tap_conv(x: mx.array, delta: mx.array, base: mx.array, group_size: int) -> mx.array:
        """Same arguments and result as `conv.two_tap_conv_ops`."""
        N, B, H = x.shape
        if group_size <= 0 or H % group_size:
            raise ValueError(f"group_size {group_size} must divide the hidden size {H}")
        G = H // group_size
        if tuple(delta.shape) != (N, B, 2, G) or tuple(base.shape) != (2, H):
            raise ValueError(f"delta {delta.shape} / base {base.shape} do not fit x {x.shape}")
        (y,) = kernel(
            inputs=[x, delta, base],
            template=[("T", x.dtype), ("GS", group_size)],
            grid=(H, B, N),
            threadgroup=(min(H, CONV_THREADS), 1, 1),
            output_shapes=[(N, B, H)],
            output_dtypes=[x.dtype],
        )
        return y

    return two_tap_conv


def path_select_kernel(factory: Callable, header: str = "", threads: int = PATH_THREADS) -> Callable:
    """Fused `path_select(...)` built with `factory`; `threads` sizes its one threadgroup."""
    kernel = factory(
        name="dflash2_path_select",
        input_names=["unary", "pred_ids", "cand_ids", "gate", "pred_codebook",
                     "succ_codebook", "temperature", "uniforms"],
        output_names=["picks", "q_rows", "lattice"],
        source=_read_body("path_select"),
        header=header,
    )

    def path_select(
        unary: mx.array,
        pred_ids: mx.array,
        cand_ids: mx.array,
        gate: mx.array,
        pred_codebook: mx.array,
        succ_codebook: mx.array,
        temperature: float = 0.0,
        uniforms: Optional[mx.array] = None,
    ) -> tuple[mx.array, mx.array]:
        """Same arguments and results as `selector.path_select_ops`."""
        N, K = unary.shape
        R = gate.shape[-1]
        # The body trusts these shapes (it reads N, K from unary and R from gate).
        if (tuple(pred_ids.shape) != (N, K) or tuple(cand_ids.shape) != (N, K) or tuple(gate.shape) != (N, R)
                or pred_codebook.ndim != 2 or succ_codebook.ndim != 2
                or pred_codebook.shape[1] != R or succ_codebook.shape[1] != R):
            raise ValueError(
                f"path_select shapes do not fit: unary {unary.shape}, ids {pred_ids.shape} {cand_ids.shape}, "
                f"gate {gate.shape}, codebooks {pred_codebook.shape} {succ_codebook.shape}")
        temperature = float(temperature)
        if temperature != 0 and uniforms is None:
            raise ValueError("sampled path selection needs uniforms")
        # Greedy ignores the uniforms, but the signature always has them.
        u = mx.zeros((N,), mx.float32) if uniforms is None else uniforms.astype(mx.float32)
        # The temperature travels as a one-element array rather than a 0-d one:
        # Metal would take a reference, CUDA a pointer; `temperature[0]` reads both.
        picks, q_rows, _ = kernel(
            inputs=[unary.astype(mx.float32), pred_ids.astype(mx.int32), cand_ids.astype(mx.int32),
                    gate, pred_codebook, succ_codebook, mx.array([temperature], mx.float32), u],
            grid=(threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(N,), (N, K), (N, K, K)],
            output_dtypes=[mx.int32, mx.float32, mx.float32],
        )
        return picks, q_rows

    return path_select


def conv_check_problem() -> tuple:
    """Small fixed conv problem (x, delta, base, group_size) for the self-check."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 64), dtype=np.float32)
    delta = 0.1 * rng.standard_normal((2, 3, 2, 4), dtype=np.float32)
    base = rng.standard_normal((2, 64), dtype=np.float32)
    return mx.array(x), mx.array(delta), mx.array(base), 16


def path_check_problem() -> tuple:
    """Small fixed path problem: integer-valued, so the scores are exact in any order.

    Returns the positional arguments of `path_select_ops` and the uniforms for a
    sampled run at temperature 1 (chosen away from every CDF step; a test holds
    that true against the twin).
    """
    rng = np.random.default_rng(11)
    N, K, R, V = 4, 8, 6, 20
    unary = rng.integers(-3, 4, (N, K)).astype(np.float32)
    pred_ids = rng.integers(0, V, (N, K)).astype(np.int32)
    cand_ids = rng.integers(0, V, (N, K)).astype(np.int32)
    gate = rng.integers(-1, 2, (N, R)).astype(np.float32)
    pred_codebook = rng.integers(-2, 3, (V, R)).astype(np.float32)
    succ_codebook = rng.integers(-2, 3, (V, R)).astype(np.float32)
    uniforms = np.array([0.13, 0.52, 0.71, 0.94], dtype=np.float32)
    args = tuple(mx.array(a) for a in (unary, pred_ids, cand_ids, gate, pred_codebook, succ_codebook))
    return args, mx.array(uniforms)


WRAPPERS = {"two_tap_conv": conv_kernel, "path_select": path_select_kernel}


def build_kernel(name: str, factory: Callable, check: Callable[[Callable], None],
                 header: str = "") -> Optional[Callable]:
    """Wrap `factory` for `name` and run `check(fn)` (raises if it disagrees with
    its twin); None after one warning on any failure."""
    try:
        fn = WRAPPERS[name](factory, header)
        check(fn)
    except Exception as exc:  # a broken kernel must only ever cost speed
        warnings.warn(f"fused kernel '{name}' disabled, using its twin: {exc}", RuntimeWarning, stacklevel=2)
        return None
    return fn


def gpu_backend() -> Optional[tuple[Callable, str]]:
    """(factory, header) for the GPU backend MLX has here, or None."""
    if mx.metal.is_available():
        return mx.fast.metal_kernel, ""
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        try:
            header = _read_body("cuda_compat.h")
        except Exception as exc:
            warnings.warn(f"fused kernels disabled, cuda_compat.h unreadable: {exc}",
                          RuntimeWarning, stacklevel=2)
            return None
        return mx.fast.cuda_kernel, header
    return None
