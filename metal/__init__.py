"""Fused-kernel sources shipped as package data (installed as `dflash2_mlx.metal`).

Each `<name>.metal` file is a kernel *body* for `mx.fast.metal_kernel`: MLX
writes the signature from the input/output names, dtypes and template args.
`cuda_compat.h` lets the same bodies compile under `mx.fast.cuda_kernel`.
"""

from importlib import resources


def read_body(name: str) -> str:
    """Text of a shipped source: `read_body("path_select")` reads path_select.metal.

    A name with a suffix (e.g. "cuda_compat.h") is read as given.
    """
    filename = name if "." in name else f"{name}.metal"
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")
