"""dflash2-mlx: lossless DFlash and DFlash 2 speculative decoding on MLX."""

__version__ = "0.1.0"
