"""The install section: versions, device, backend and which fused kernels run;
and the memory the device offers (read by the memory estimate)."""

import os
import platform
from typing import Optional

import mlx.core as mx

from .report import Finding, Section


def environment() -> Section:
    import importlib.metadata as md

    from ...device import backend_name
    from ...engine.drafter.fused import kernel_status

    backend = backend_name()
    versions = {"mlx": mx.__version__, "python": platform.python_version()}
    for pkg in ("mlx-lm", "dflash2-mlx"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    info = _device_info()
    findings = [
        Finding("versions", "info", ", ".join(f"{k} {v}" for k, v in versions.items())),
        Finding("device", "info", f"{info.get('device_name') or platform.machine()} ({platform.platform()})"),
    ]
    if backend == "cpu":
        findings.append(Finding(
            "backend", "warn",
            "cpu: no Metal or CUDA here. Output is exact, but a block verify costs about as much per row as "
            "plain decoding (a 16-row forward is ~10x a 1-row one on the Linux CPU build), so speculation is "
            "slower than plain decoding on this backend"))
    else:
        findings.append(Finding("backend", "ok", backend))
    for name, how in kernel_status().items():
        if how == "kernel":
            findings.append(Finding(f"kernel {name}", "ok", "fused kernel active"))
        elif backend == "cpu":
            findings.append(Finding(f"kernel {name}", "ok", "plain-MLX twin (the fused kernel needs a GPU backend)"))
        else:
            findings.append(Finding(f"kernel {name}", "warn",
                                    f"plain-MLX twin on {backend}: the fused kernel is unavailable or disabled"))
    return Section("MLX", tuple(findings), {"backend": backend, "versions": versions, "device": info,
                                            "kernels": kernel_status()})


def _device_info() -> dict:
    try:
        return dict(mx.device_info())
    except Exception:  # older MLX
        return {}
