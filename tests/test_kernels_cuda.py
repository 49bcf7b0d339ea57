"""The kernel bodies compile as `mx.fast.cuda_kernel` bodies (nvcc, PTX only).

There is no GPU here, so this proves only that MLX's generated CUDA signature
plus metal/cuda_compat.h plus each body is valid CUDA, for the exact inputs the
library's wrappers pass. Running them is left to the builder's self-check.
"""

import mlx.core as mx
import pytest

from dflash2_mlx.kernels import metal_cuda as metal_kernels
from dflash2_mlx.metal import read_body

from kernel_harness.checks import conv_inputs, path_inputs
from kernel_harness.cuda import cuda_source, nvcc_compile, nvcc_path

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is needed for the CUDA compile check")


class Recorder:
    """A kernel factory that records what the wrapper asks for and returns zeros."""

    def __call__(self, **spec):
        self.spec = spec
        return self.kernel

    def kernel(self, **call):
        self.call = call
        return [mx.zeros(s, d) for s, d in zip(call["output_shapes"], call["output_dtypes"])]

    def cuda(self) -> str:
        s, c = self.spec, self.call
        return cuda_source(s["name"], s["header"], s["source"], s["input_names"], c["inputs"],
                           s["output_names"], c["output_dtypes"], c.get("template") or [])


@pytest.mark.parametrize("kind", ["two_tap_conv", "path_select"])
def test_body_compiles_as_cuda(tmp_path, kind):
    rec = Recorder()
    header = read_body("cuda_compat.h")
    if kind == "two_tap_conv":
        metal_kernels.conv_kernel(rec, header)(*conv_inputs(0, 2, 16, 64, 8, mx.bfloat16))
    else:
        metal_kernels.path_select_kernel(rec, header)(*path_inputs(0, 15, 16, 32, 1000, mx.bfloat16))
    ptx = nvcc_compile(rec.cuda(), tmp_path, kind)
    assert f"custom_kernel_dflash2_{kind}" in ptx
