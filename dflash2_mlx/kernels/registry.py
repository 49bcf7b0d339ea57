"""Which fused kernels are active.

Each fused kernel has a plain-MLX twin beside its op
(`engine.drafter.conv.two_tap_conv_ops`, `engine.drafter.selector.path_select_ops`).
The op asks for its kernel with `active(name, check)`, handing over the check
that compares a built kernel with the twin (the op imports its kernel, never
the reverse, as mlx-lm's `gated_delta.py` does). Nothing is registered at
import time: a kernel is built once, the first time it is asked for, and only
where a GPU backend exists; everywhere else `active` returns None and callers
use the twin. `set_kernels_enabled(False)` forces the twins.
"""

from typing import Callable, Mapping, Optional

from . import metal_cuda

_enabled = True
_built: dict[str, Optional[Callable]] = {}

Check = Callable[[Callable], None]  # raises when a built kernel disagrees with its twin


def set_kernels_enabled(enabled: bool) -> None:
    """Globally allow (default) or forbid fused kernels; forbidding forces the twins."""
    global _enabled
    _enabled = enabled


def active(name: str, check: Check) -> Optional[Callable]:
    """The fused kernel `name` (one of `metal_cuda.WRAPPERS`), built and checked
    with `check` on first use, or None when the twin should run."""
    if name not in metal_cuda.WRAPPERS:
        raise ValueError(f"no fused kernel named '{name}'")
    if not _enabled:
        return None
    if name not in _built:
        backend = metal_cuda.gpu_backend()
        _built[name] = None if backend is None else metal_cuda.build_kernel(
            name, backend[0], check, header=backend[1])
    return _built[name]


def status(checks: Mapping[str, Check]) -> dict[str, str]:
    """name -> 'kernel' or 'twin' for each of `checks`, for `doctor` and benchmarks."""
    return {name: ("kernel" if active(name, check) is not None else "twin") for name, check in checks.items()}
