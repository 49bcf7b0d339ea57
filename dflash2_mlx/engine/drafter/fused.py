"""The fused kernels of the drafter's ops, each with the check against its twin."""

from ...kernels import registry
from . import conv, selector

CHECKS = {"two_tap_conv": conv.agrees_with_twin, "path_select": selector.agrees_with_twin}


def kernel_status() -> dict[str, str]:
    """name -> 'kernel' (fused, checked against its twin) or 'twin' (plain MLX)."""
    return registry.status(CHECKS)
