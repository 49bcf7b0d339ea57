"""Which fused kernels are active.

Each fused kernel has a plain-MLX twin beside its op (`engine.conv.two_tap_conv_ops`,
`engine.selector.path_select_ops`). The op module registers the kernel's name
with an agreement check against its twin (the op imports its kernel, never the
reverse, as mlx-lm's `gated_delta.py` does). A kernel is built once, the first
time it is asked for, and only where a GPU backend exists; everywhere else
`active` returns None and callers use the twin. `set_kernels_enabled(False)`
forces the twins.
"""

from typing import Callable, Optional

from . import metal

_enabled = True
_built: dict[str, Optional[Callable]] = {}
# name -> check(fn) that raises when a built kernel disagrees with its twin.
_checks: dict[str, Callable[[Callable], None]] = {}


def register(name: str, check: Callable[[Callable], None]) -> None:
    """Declare the fused kernel `name` (one of `metal.WRAPPERS`) and its twin check."""
    if name not in metal.WRAPPERS:
        raise ValueError(f"no fused kernel named '{name}'")
    _checks[name] = check
    _built.pop(name, None)


def set_kernels_enabled(enabled: bool) -> None:
    """Globally allow (default) or forbid fused kernels; forbidding forces the twins."""
    global _enabled
    _enabled = enabled


def active(name: str) -> Optional[Callable]:
    """The fused kernel for `name`, or None when the twin should run."""
    if not _enabled or name not in _checks:
        return None
    if name not in _built:
        backend = metal.gpu_backend()
        _built[name] = None if backend is None else metal.build_kernel(
            name, backend[0], _checks[name], header=backend[1])
    return _built[name]


def status() -> dict[str, str]:
    """name -> 'kernel' or 'twin', for `doctor` and benchmarks."""
    return {name: ("kernel" if active(name) is not None else "twin") for name in _checks}
