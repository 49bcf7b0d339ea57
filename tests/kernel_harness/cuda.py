"""Compile-only check of the kernel bodies as `mx.fast.cuda_kernel` bodies.

`cuda_source` writes what MLX's `build_kernel` (mlx/backend/cuda/custom_kernel.cpp)
generates: its default header, the user header, then inside
`namespace mlx::core::cu` a `__global__ void custom_kernel_<name><hash>(...)`
with inputs as `const T*`, `<in>_shape` / `_strides` as `__grid_constant__`
Shape / Strides and `_ndim` as int when the body mentions them, outputs as
`T*`, template arguments as `constexpr` / `using` lines, then the body.

MLX's default header includes MLX's own device utilities, which are not
installed here; `STAND_IN_PRELUDE` declares the few names the generated code
uses (Shape, Strides, `inf`). nvcc then compiles the result to PTX: this
proves the bodies are valid CUDA under MLX's signature, not that they run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx

# MLX's dtype_to_cuda_type.
CUDA_TYPES = {
    mx.float32: "float",
    mx.float16: "__half",
    mx.bfloat16: "__nv_bfloat16",
    mx.bool_: "bool",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.uint32: "uint32_t",
}

STAND_IN_PRELUDE = """
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cooperative_groups.h>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;   // MAX_NDIM = 10
using Strides = cuda::std::array<int64_t, 10>;
}  // namespace mlx::core::cu
#define inf cuda::std::numeric_limits<float>::infinity()
"""


def _template_hash(template) -> str:
    out = ""
    for _, value in template:
        if isinstance(value, mx.Dtype):
            out += "_" + {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}[value]
        elif isinstance(value, bool):
            out += "_t" if value else "_f"
        else:
            out += f"_{value}"
    return out


def cuda_source(name: str, header: str, source: str, input_names: Sequence[str],
                inputs: Sequence[mx.array], output_names: Sequence[str],
                output_dtypes: Sequence[mx.Dtype], template=()) -> str:
    """The CUDA translation unit MLX would JIT-compile (stand-in prelude first)."""
    func = "custom_kernel_" + name + _template_hash(template)
    params = []
    for in_name, arr in zip(input_names, inputs):
        params.append(f"    const {CUDA_TYPES[arr.dtype]}* {in_name}")
        if arr.ndim > 0:
            if in_name + "_shape" in source:
                params.append(f"    const __grid_constant__ Shape {in_name}_shape")
            if in_name + "_strides" in source:
                params.append(f"    const __grid_constant__ Strides {in_name}_strides")
            if in_name + "_ndim" in source:
                params.append(f"    const __grid_constant__ int {in_name}_ndim")
    for out_name, dtype in zip(output_names, output_dtypes):
        params.append(f"    {CUDA_TYPES[dtype]}* {out_name}")
    consts = []
    for t_name, value in template:
        if isinstance(value, mx.Dtype):
            consts.append(f"  using {t_name} = {CUDA_TYPES[value]};")
        elif isinstance(value, bool):
            consts.append(f"  constexpr bool {t_name} = {'true' if value else 'false'};")
        else:
            consts.append(f"  constexpr int {t_name} = {value};")
    return (STAND_IN_PRELUDE + header
            + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
            + f"__global__ void {func}(\n" + ",\n".join(params) + ") {\n"
            + ("\n".join(consts) + "\n\n" if consts else "")
            + source + "\n}\n\n} // namespace mlx::core::cu\n")


def nvcc_path() -> Optional[str]:
    return shutil.which("nvcc")


def nvcc_compile(cuda: str, build_dir: Path, stem: str, arch: str = "sm_80") -> str:
    """Compile `cuda` to PTX with nvcc; returns the PTX, raises with nvcc's stderr."""
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    src = build_dir / f"{stem}.cu"
    ptx = build_dir / f"{stem}.ptx"
    src.write_text(cuda)
    cmd = [nvcc_path() or "nvcc", "-std=c++17", f"-arch={arch}", "-ptx", str(src), "-o", str(ptx)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{done.stderr}")
    return ptx.read_text()
