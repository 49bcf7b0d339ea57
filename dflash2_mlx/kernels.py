"""Which fused kernels are active.

Each fused kernel has a plain-MLX twin (`conv.two_tap_conv_ops`,
`selector.path_select_ops`). A kernel is built once, the first time it is asked
for, and only where its backend exists; everywhere else `active` returns None
and callers use the twin. `set_kernels_enabled(False)` forces the twins.
"""

from typing import Callable, Optional

_enabled = True
_built: dict[str, Optional[Callable]] = {}
# name -> zero-argument builder returning the callable, or None where it cannot run.
_builders: dict[str, Callable[[], Optional[Callable]]] = {}


def register(name: str, builder: Callable[[], Optional[Callable]]) -> None:
    _builders[name] = builder
    _built.pop(name, None)


def set_kernels_enabled(enabled: bool) -> None:
    """Globally allow (default) or forbid fused kernels; forbidding forces the twins."""
    global _enabled
    _enabled = enabled


def active(name: str) -> Optional[Callable]:
    """The fused kernel for `name`, or None when the twin should run."""
    if not _enabled or name not in _builders:
        return None
    if name not in _built:
        _built[name] = _builders[name]()
    return _built[name]


def status() -> dict[str, str]:
    """name -> 'kernel' or 'twin', for `doctor` and benchmarks."""
    return {name: ("kernel" if active(name) is not None else "twin") for name in _builders}


# The fused Metal/CUDA builders register themselves on import (kept last: the
# module imports this one).
from . import metal_kernels  # noqa: E402,F401
