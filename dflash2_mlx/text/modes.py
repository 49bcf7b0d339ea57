"""Names of the decoding modes, as every report shows them (imports nothing: the CLI reads it early)."""

# The one table of decoding-mode labels: mode -> (name, short name for narrow columns).
MODE_LABELS = {
    "ar": ("autoregressive", "AR"),
    "dflash": ("DFlash", "DFlash"),
    "dflash2": ("DFlash 2", "DFlash 2"),
    # Tree verification (docs/tree.md): a bench "block" of these modes is the tree's rows.
    "dflash-tree": ("DFlash tree", "DFlash tree"),
    "dflash2-tree": ("DFlash 2 tree", "DFlash 2 tree"),
    "mlx-lm-spec": ("mlx-lm speculative", "mlx-lm spec"),
    "mlx-lm": ("mlx_lm.stream_generate", "mlx-lm plain"),
}


def mode_name(mode: str) -> str:
    return MODE_LABELS[mode][0]


def short_mode_name(mode: str) -> str:
    return MODE_LABELS[mode][1]
