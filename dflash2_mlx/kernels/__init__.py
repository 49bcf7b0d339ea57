"""Fused kernels (sources in `dflash2_mlx.metal`) and the registry that says which are active."""
