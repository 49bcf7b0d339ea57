"""Run `mx.fast.metal_kernel` bodies on the CPU, without Metal.

`MetalHarness.metal_kernel` has the same arguments as `mx.fast.metal_kernel`
and returns a callable with the same call arguments, so library code that
takes a kernel factory can be handed either one. A call:

1. writes the Metal source exactly as MLX's `write_signature` does
   (mlx/backend/common/metal_kernel.cpp): template line, `[[kernel]] void
   custom_kernel_<name>...(`, inputs as `const device T*` (`constant` below 8
   elements, `&` for 0-d), `<in>_shape` / `_strides` / `_ndim` only when the
   body mentions them, outputs as `device T*`, then the thread attributes the
   body mentions, in MLX's order, then the body;
2. compiles it as C++ with g++ against `metal_compat.h`, plus a driver that
   dispatches the grid like `dispatchThreads` (MLX clamps the threadgroup to
   the grid; edge groups are partial);
3. runs every threadgroup in turn: threads one after another when the body
   has no `threadgroup_barrier`, otherwise one OS thread per simulated thread
   meeting at a std::barrier.

Outputs start as 0xFF bytes (NaN / -1) unless `init_value` is given, so an
element the kernel forgets to write cannot pass for a right answer.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

HERE = Path(__file__).resolve().parent

# MLX's get_type_string (mlx/backend/common/compiled.cpp).
METAL_TYPES = {
    mx.float32: "float",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.bool_: "bool",
    mx.int8: "int8_t",
    mx.int16: "int16_t",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.uint8: "uint8_t",
    mx.uint16: "uint16_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
}

# MLX's metal_attributes table, in its order: (name, type).
METAL_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]

# The value each attribute takes in the driver (names defined there).
_ATTRIBUTE_VALUES = {
    "dispatch_quadgroups_per_threadgroup": "(tx * ty * tz + 3) / 4",
    "dispatch_simdgroups_per_threadgroup": "(tx * ty * tz + 31) / 32",
    "dispatch_threads_per_threadgroup": "uint3{tx, ty, tz}",
    "grid_origin": "uint3{0, 0, 0}",
    "grid_size": "uint3{gx, gy, gz}",
    "quadgroup_index_in_threadgroup": "idx / 4",
    "quadgroups_per_threadgroup": "(ax * ay * az + 3) / 4",
    "simdgroup_index_in_threadgroup": "idx / 32",
    "simdgroups_per_threadgroup": "(ax * ay * az + 31) / 32",
    "thread_execution_width": "32u",
    "thread_index_in_quadgroup": "idx % 4",
    "thread_index_in_simdgroup": "idx % 32",
    "thread_index_in_threadgroup": "idx",
    "thread_position_in_grid": "uint3{bx * tx + lx, by * ty + ly, bz * tz + lz}",
    "thread_position_in_threadgroup": "uint3{lx, ly, lz}",
    "threadgroup_position_in_grid": "uint3{bx, by, bz}",
    "threadgroups_per_grid": "uint3{nbx, nby, nbz}",
    "threads_per_grid": "uint3{gx, gy, gz}",
    "threads_per_simdgroup": "32u",
    "threads_per_threadgroup": "uint3{ax, ay, az}",
}

# No FMA contraction: the twins on the CPU multiply and add separately.
CXX_FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-pthread"]
MAX_CONSTANT_ARRAY_SIZE = 8  # MLX passes smaller inputs in `constant` memory
MAX_THREADS_PER_THREADGROUP = 1024


class HarnessCompileError(RuntimeError):
    """g++ rejected the generated source; the message carries its stderr."""


def _template_value(value) -> str:
    if isinstance(value, mx.Dtype):
        return METAL_TYPES[value]
    if isinstance(value, bool):
        return "1" if value else "0"  # MLX streams bools without boolalpha
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"template arguments are dtypes, ints or bools, not {value!r}")


def _template_kind(value) -> str:
    if isinstance(value, mx.Dtype):
        return "typename"
    return "bool" if isinstance(value, bool) else "int"


def _kernel_name(name, template, inputs, output_dtypes) -> str:
    """MLX's kernel name: template hash, then input/output dtypes."""
    kernel_name = "custom_kernel_" + name
    if template:
        args = ", ".join(_template_value(v) for _, v in template)
        kernel_name += "_" + ("<" + args).replace("<", "_").replace(">", "_").replace(", ", "_")
    for arr in inputs:
        kernel_name += "_" + METAL_TYPES[arr.dtype]
        if arr.ndim == 0:
            kernel_name += "s"
        elif arr.size < MAX_CONSTANT_ARRAY_SIZE:
            kernel_name += "c"
    for dtype in output_dtypes:
        kernel_name += "_" + METAL_TYPES[dtype]
    return kernel_name


class _Param:
    """One kernel parameter: its Metal declaration and its driver-side cast."""

    def __init__(self, decl: str, cast: str):
        self.decl = decl
        self.cast = cast


def metal_signature(
    kernel_name: str,
    header: str,
    source: str,
    input_names: Sequence[str],
    inputs: Sequence[mx.array],
    output_names: Sequence[str],
    output_dtypes: Sequence[mx.Dtype],
    template: Sequence[tuple],
) -> tuple[str, list[_Param], list[str]]:
    """The Metal source MLX would compile, its parameters, and its attributes."""
    params: list[_Param] = []
    for name, arr in zip(input_names, inputs):
        ty = METAL_TYPES[arr.dtype]
        space = "constant" if arr.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if arr.ndim == 0 else "*"
        cast = f"*(const {ty}*)" if arr.ndim == 0 else f"(const {ty}*)"
        params.append(_Param(f"const {space} {ty}{ref} {name}", cast))
        if arr.ndim > 0:
            if name + "_shape" in source:
                params.append(_Param(f"const constant int* {name}_shape", "(const int*)"))
            if name + "_strides" in source:
                params.append(_Param(f"const constant int64_t* {name}_strides", "(const int64_t*)"))
            if name + "_ndim" in source:
                params.append(_Param(f"const constant int& {name}_ndim", "*(const int*)"))
    for name, dtype in zip(output_names, output_dtypes):
        ty = METAL_TYPES[dtype]
        params.append(_Param(f"device {ty}* {name}", f"({ty}*)"))
    attributes = [a for a, _ in METAL_ATTRIBUTES if a in source]
    attribute_types = dict(METAL_ATTRIBUTES)

    lines = [header]
    if template:
        lines.append("template <" + ", ".join(f"{_template_kind(v)} {n}" for n, v in template) + ">")
    decls = [f"  {p.decl} [[buffer({i})]]" for i, p in enumerate(params)]
    decls += [f"  {attribute_types[a]} {a} [[{a}]]" for a in attributes]
    lines.append(f"[[kernel]] void {kernel_name}(\n" + ",\n".join(decls) + ") {")
    lines.append(source)
    lines.append("}")
    return "\n".join(lines) + "\n", params, attributes


def _driver(kernel_name: str, template, params, attributes, barriers: bool) -> str:
    """C++ that dispatches the grid over the kernel, like dispatchThreads."""
    targs = ""
    if template:
        targs = "<" + ", ".join(_template_value(v) for _, v in template) + ">"
    call_args = [f"{p.cast}args[{i}]" for i, p in enumerate(params)]
    call_args += [_ATTRIBUTE_VALUES[a] for a in attributes]
    call = f"{kernel_name}{targs}(\n        " + ",\n        ".join(call_args) + ");"
    if barriers:
        run_group = """
        std::barrier<> bar(ax * ay * az);
        std::vector<std::thread> workers;
        for (uint lz = 0; lz < az; ++lz)
          for (uint ly = 0; ly < ay; ++ly)
            for (uint lx = 0; lx < ax; ++lx)
              workers.emplace_back([&, lx, ly, lz] {
                harness_barrier = &bar;
                one_thread(lx, ly, lz);
                // A finished thread must not hold up later barriers.
                bar.arrive_and_drop();
              });
        for (auto& w : workers) w.join();"""
    else:
        run_group = """
        for (uint lz = 0; lz < az; ++lz)
          for (uint ly = 0; ly < ay; ++ly)
            for (uint lx = 0; lx < ax; ++lx)
              one_thread(lx, ly, lz);"""
    return f"""
extern "C" void harness_run(void** args, const uint* grid, const uint* group) {{
  const uint gx = grid[0], gy = grid[1], gz = grid[2];
  // MLX clamps the threadgroup to the grid before dispatchThreads.
  const uint tx = std::min(group[0], gx), ty = std::min(group[1], gy), tz = std::min(group[2], gz);
  const uint nbx = (gx + tx - 1) / tx, nby = (gy + ty - 1) / ty, nbz = (gz + tz - 1) / tz;
  for (uint bz = 0; bz < nbz; ++bz)
    for (uint by = 0; by < nby; ++by)
      for (uint bx = 0; bx < nbx; ++bx) {{
        // Edge threadgroups are partial, as with non-uniform dispatch.
        const uint ax = std::min(tx, gx - bx * tx), ay = std::min(ty, gy - by * ty),
                   az = std::min(tz, gz - bz * tz);
        auto one_thread = [&](uint lx, uint ly, uint lz) {{
          const uint idx = (lz * ay + ly) * ax + lx;
          (void)idx;
          {call}
        }};{run_group}
      }}
}}
"""


def _to_numpy(arr: mx.array) -> np.ndarray:
    """Row-contiguous host copy with the exact bytes MLX holds."""
    if arr.dtype in (mx.bfloat16, mx.float16):
        arr = arr.view(mx.uint16)  # numpy has no bfloat16; keep the bits
    elif arr.dtype == mx.bool_:
        arr = arr.astype(mx.uint8)
    return np.ascontiguousarray(np.array(arr))


def _from_numpy(buf: np.ndarray, dtype: mx.Dtype) -> mx.array:
    out = mx.array(buf)
    return out.view(dtype) if dtype in (mx.bfloat16, mx.float16) else out.astype(dtype)


_NUMPY_STORAGE = {mx.float32: np.float32, mx.float16: np.uint16, mx.bfloat16: np.uint16,
                  mx.int32: np.int32, mx.int64: np.int64, mx.uint32: np.uint32,
                  mx.int8: np.int8, mx.int16: np.int16, mx.uint8: np.uint8,
                  mx.uint16: np.uint16, mx.uint64: np.uint64, mx.bool_: np.uint8}


class MetalHarness:
    """Compiles and runs Metal kernel bodies on the CPU; artefacts go to `build_dir`."""

    def __init__(self, build_dir: Path, cxx: Optional[str] = None):
        self.build_dir = Path(build_dir)
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self.cxx = cxx or shutil.which("g++")
        if self.cxx is None:
            raise HarnessCompileError("g++ not found")
        self._libs: dict[str, ctypes.CDLL] = {}
        self._pch_flags: Optional[list[str]] = None
        self.sources: dict[str, str] = {}  # kernel name -> last generated Metal source

    def metal_kernel(self, name, input_names, output_names, source, header="",
                     ensure_row_contiguous=True, atomic_outputs=False):
        """Same arguments as `mx.fast.metal_kernel`."""
        if atomic_outputs:
            raise NotImplementedError("the harness does not model atomic outputs")
        if not output_names:
            raise ValueError("[metal_kernel] Must specify at least one output.")
        return _HarnessKernel(self, name, list(input_names), list(output_names), source, header)

    def _precompiled_header_dir(self) -> list[str]:
        """-I flag for a precompiled metal_compat.h (halves each compile), or nothing."""
        if self._pch_flags is None:
            pch_dir = self.build_dir / "pch"
            pch_dir.mkdir(exist_ok=True)
            cmd = [self.cxx, *CXX_FLAGS, "-x", "c++-header", str(HERE / "metal_compat.h"),
                   "-o", str(pch_dir / "metal_compat.h.gch")]
            ok = subprocess.run(cmd, capture_output=True, text=True).returncode == 0
            # g++ checks each include directory for the .gch before the header itself.
            self._pch_flags = [f"-I{pch_dir}"] if ok else []
        return self._pch_flags

    def compile(self, cpp: str) -> ctypes.CDLL:
        key = hashlib.sha1(cpp.encode()).hexdigest()[:16]
        if key in self._libs:
            return self._libs[key]
        src = self.build_dir / f"kernel_{key}.cpp"
        lib = self.build_dir / f"kernel_{key}.so"
        src.write_text(cpp)
        cmd = [self.cxx, *CXX_FLAGS, "-shared", "-Wall", "-Wno-attributes", "-Wno-unused-variable",
               *self._precompiled_header_dir(), f"-I{HERE}", str(src), "-o", str(lib)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise HarnessCompileError(f"{' '.join(cmd)}\n{done.stderr}")
        handle = ctypes.CDLL(str(lib))
        handle.harness_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint),
                                       ctypes.POINTER(ctypes.c_uint)]
        handle.harness_run.restype = None
        self._libs[key] = handle
        return handle


class _HarnessKernel:
    def __init__(self, harness, name, input_names, output_names, source, header):
        self.harness = harness
        self.name = name
        self.input_names = input_names
        self.output_names = output_names
        self.source = source
        self.header = header

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
                 template=None, init_value=None, verbose=False, stream=None):
        """Same call arguments as the callable `mx.fast.metal_kernel` returns."""
        if len(inputs) != len(self.input_names):
            raise ValueError(f"[metal_kernel] Expected `inputs` to have size {len(self.input_names)}")
        if len(output_shapes) != len(self.output_names) or len(output_dtypes) != len(self.output_names):
            raise ValueError("[metal_kernel] output_shapes/output_dtypes do not match output_names")
        if int(np.prod(threadgroup)) > MAX_THREADS_PER_THREADGROUP:
            raise ValueError("Thread group size is greater than the maximum allowed threads per threadgroup")
        inputs = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
        template = list(template or [])
        kernel_name = _kernel_name(self.name, template, inputs, output_dtypes)
        metal, params, attributes = metal_signature(
            kernel_name, self.header, self.source, self.input_names, inputs,
            self.output_names, output_dtypes, template)
        self.harness.sources[self.name] = metal
        if verbose:
            print(metal)
        barriers = "threadgroup_barrier" in self.source
        cpp = ('#include "metal_compat.h"\n' + metal + '#include "metal_compat_end.h"\n'
               + _driver(kernel_name, template, params, attributes, barriers))
        lib = self.harness.compile(cpp)

        keep = []  # host buffers in signature order
        for name, arr in zip(self.input_names, inputs):
            keep.append(_to_numpy(arr))
            if arr.ndim > 0:
                if name + "_shape" in self.source:
                    keep.append(np.array(arr.shape, dtype=np.int32))
                if name + "_strides" in self.source:
                    # Row-contiguous strides, in elements (what MLX passes after its copy).
                    strides = np.cumprod((list(arr.shape[1:]) + [1])[::-1])[::-1]
                    keep.append(np.array(strides, dtype=np.int64))
                if name + "_ndim" in self.source:
                    keep.append(np.array(arr.ndim, dtype=np.int32))
        outputs = []
        for shape, dtype in zip(output_shapes, output_dtypes):
            storage = _NUMPY_STORAGE[dtype]
            if init_value is None:
                nbytes = int(np.prod(shape)) * np.dtype(storage).itemsize
                buf = np.frombuffer(b"\xff" * nbytes, dtype=storage).reshape(tuple(shape)).copy()
            else:
                buf = _to_numpy(mx.full(tuple(shape), init_value, dtype=dtype))
            outputs.append(buf)
        keep.extend(outputs)

        args = (ctypes.c_void_p * len(keep))(*[b.ctypes.data for b in keep])
        grid_c = (ctypes.c_uint * 3)(*grid)
        group_c = (ctypes.c_uint * 3)(*threadgroup)
        lib.harness_run(args, grid_c, group_c)
        return [_from_numpy(buf, dtype) for buf, dtype in zip(outputs, output_dtypes)]
