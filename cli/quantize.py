"""`dflash2 quantize`: save an MLX-quantized copy of a drafter as a new folder."""

from pathlib import Path
from typing import Annotated

import typer

from . import options as o
from . import ui


def quantize(
    drafter: o.Drafter = "builtin",
    draft_quant: Annotated[str, typer.Option("--draft-quant", "-q", help="e.g. w4a32:gs64, w8a32, w4abf16.")] = "w4a32:gs64",
    out: Annotated[Path, typer.Option("--out", "-o", help="New folder to write (must not exist).")] = None,
    debug: o.Debug = False,
):
    """Quantize a drafter and save it as its own folder (the original is never rewritten)."""
    from dflash2_mlx.errors import DFlashError
    from dflash2_mlx.loading.hub import resolve
    from dflash2_mlx.loading.builtin import resolve_builtin
    from dflash2_mlx.loading.checkpoints import load_drafter, read_config
    from dflash2_mlx.loading.quantize import DraftQuant, quantize_drafter, save_quantized_drafter

    quant = DraftQuant.parse(draft_quant)
    if out is None:
        raise DFlashError("no output folder: pass --out FOLDER for the quantized drafter")
    source = resolve(resolve_builtin(drafter, "drafter"), "drafter")
    config = read_config(source, "drafter")
    if "quantization" in config:
        raise DFlashError(f"drafter '{drafter}' is already quantized: quantize the original checkpoint")
    model = load_drafter(str(source))
    meta = quantize_drafter(model, quant)
    folder = save_quantized_drafter(model, config, meta, quant, source, out)
    ui.status(f"saved {quant} drafter to {folder}")
