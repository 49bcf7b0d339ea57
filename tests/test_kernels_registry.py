"""Registration and fallback of the fused kernels (no compiler needed)."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.drafter import conv
from dflash2_mlx.engine.drafter.fused import CHECKS, kernel_status
from dflash2_mlx.kernels import metal_cuda as metal_kernels
from dflash2_mlx.kernels import registry as kernels
from dflash2_mlx.metal import read_body

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_registry(monkeypatch):
    """Forget built kernels for the test, and restore the cache afterwards."""
    monkeypatch.setattr(kernels, "_built", {})
    monkeypatch.setattr(kernels, "_enabled", True)


def gpu_backend() -> bool:
    cuda = getattr(mx, "cuda", None)
    return mx.metal.is_available() or (cuda is not None and cuda.is_available())


def test_both_kernels_are_registered():
    assert set(kernel_status()) >= {"two_tap_conv", "path_select"}


def test_active_matches_the_backend(fresh_registry):
    for name in ("two_tap_conv", "path_select"):
        if gpu_backend():
            assert callable(kernels.active(name, CHECKS[name]))
        else:
            assert kernels.active(name, CHECKS[name]) is None
            assert kernel_status()[name] == "twin"


def test_disabled_kernels_are_never_built(fresh_registry, monkeypatch):
    monkeypatch.setattr(metal_kernels, "gpu_backend", lambda: pytest.fail("builder ran while disabled"))
    kernels.set_kernels_enabled(False)
    assert kernels.active("two_tap_conv", CHECKS["two_tap_conv"]) is None


def test_failing_build_warns_once_and_falls_back(fresh_registry, monkeypatch):
    # Pretend Metal exists but cannot build anything.
    def broken_factory(**kwargs):
        raise RuntimeError("no Metal compiler")

    monkeypatch.setattr(metal_kernels, "gpu_backend", lambda: (broken_factory, ""))
    with pytest.warns(RuntimeWarning, match="two_tap_conv.*no Metal compiler") as caught:
        assert kernels.active("two_tap_conv", CHECKS["two_tap_conv"]) is None
        assert kernels.active("two_tap_conv", CHECKS["two_tap_conv"]) is None  # cached: no second warning
    assert len(caught) == 1
    x = mx.array(np.random.default_rng(0).standard_normal((1, 4, 32), dtype=np.float32))
    delta, base = mx.zeros((1, 4, 2, 4)), mx.ones((2, 32))
    assert mx.array_equal(conv.two_tap_conv(x, delta, base, 8), conv.two_tap_conv_ops(x, delta, base, 8))


def test_failing_first_call_warns_once(fresh_registry, monkeypatch):
    # Building succeeds, but the kernel raises when run (e.g. a Metal compile error).
    def factory(**kwargs):
        def kernel(**call):
            raise RuntimeError("Unable to build metal library")
        return kernel

    monkeypatch.setattr(metal_kernels, "gpu_backend", lambda: (factory, ""))
    with pytest.warns(RuntimeWarning, match="path_select") as caught:
        assert kernels.active("path_select", CHECKS["path_select"]) is None
    assert len(caught) == 1


def test_sources_ship_as_package_data():
    assert "thread_position_in_grid" in read_body("two_tap_conv")
    assert "threadgroup_barrier" in read_body("path_select")
    assert "__syncthreads" in read_body("cuda_compat.h")
    # The .metal/.h files only reach an installed package through this line.
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"dflash2_mlx.metal" = ["*.metal", "*.h"]' in pyproject
