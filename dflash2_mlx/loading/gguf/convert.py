"""Convert a GGUF file to an mlx-lm folder (config.json, model.safetensors, tokenizer files),
and keep one converted copy per file in a cache folder the caller chooses."""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from ...errors import CheckpointError, DFlashError
from .config import architecture, mlx_lm_config, value
from .read import check_gguf_file, read_gguf
from .tokenizer import write_tokenizer
from .weights import check_complete, check_types, mlx_lm_weights


def convert_gguf(path: Path, out: Path) -> Path:
    """Write the mlx-lm folder `out` (which must not exist) for the GGUF file `path`.

    Quantized tensors stay packed (MLX affine, group 32, bits per tensor, in
    config.json's "quantization" as mlx-lm writes it; repack.py says how each
    GGML type maps); float tensors keep their dtype. The folder is written
    beside `out` and renamed into place, so a failure leaves nothing behind."""
    path, out = Path(path), Path(out)
    if out.exists():
        raise DFlashError(f"'{out}' already exists: choose a new folder for the converted model")
    tensors, metadata = read_gguf(path)
    where = str(path)
    arch = architecture(metadata, where)
    check_types(tensors, where)
    check_complete(tensors, arch, int(_layers(metadata)), where)
    config = mlx_lm_config(metadata, tensors, where)
    weights, quant = mlx_lm_weights(tensors, arch, config, where)
    if quant:
        config["quantization"] = quant
        config["quantization_config"] = quant  # mlx-lm's save_config writes both
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_tokenizer(metadata, tmp, config["max_position_embeddings"], where)
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _layers(metadata: dict) -> int:
    a = value(metadata, "general.architecture")
    layers = value(metadata, f"{a}.block_count")
    if layers is None:
        raise CheckpointError(f"GGUF metadata lacks '{a}.block_count': the file is incomplete")
    return layers


def cache_key(path: Path) -> str:
    """The file's identity without reading 100 MB-100 GB: its full path, size and mtime."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]


def converted_folder(path: Path, cache: Path, progress: Optional[Callable[[str], None]] = None) -> Path:
    """The mlx-lm folder for GGUF `path` under `cache`, converted on first use only.
    A changed file (size or mtime) is converted again into a new folder."""
    path = Path(path).expanduser()
    check_gguf_file(path)
    folder = Path(cache) / "gguf" / f"{path.stem}-{cache_key(path)}"
    if (folder / "config.json").is_file():
        return folder
    if progress:
        progress(f"converting {path.name} to an mlx-lm folder (once; kept in {folder.parent})")
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        return convert_gguf(path, folder)
    except (DFlashError, OSError):
        if (folder / "config.json").is_file():  # another process converted it meanwhile
            return folder
        raise
