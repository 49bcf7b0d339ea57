"""Draft quantization: in memory, and saved as its own MLX folder.

Linear layers take the requested bits; the selector codebooks never go below
8 bits (their rows are compared pairwise, so their error compounds); norms and
conv base kernels are not layers and stay as they are. Activations default to
fp32: fp16 overflows DFlash residuals and zeroes acceptance on M1/M2.
"""

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import DFlashError

CODEBOOK_MIN_BITS = 8
_ACTIVATIONS = {"32": mx.float32, "bf16": mx.bfloat16, "16": mx.float16, "fp16": mx.float16}
_SPEC = re.compile(r"^w(?P<bits>\d+)a(?P<act>32|bf16|16|fp16)(?::gs(?P<gs>\d+))?$")


@dataclass(frozen=True)
class DraftQuant:
    """A draft quantization setting, spelled like `w4a32:gs64`."""

    bits: int
    activation: str = "32"
    group_size: int = 64

    @classmethod
    def parse(cls, spec: str) -> "DraftQuant":
        m = _SPEC.match(spec.strip().lower())
        if not m:
            raise DFlashError(
                f"draft quantization '{spec}' is not understood: use w4a32, w8a32, w4abf16 "
                "(optionally with :gs32, :gs64 or :gs128)"
            )
        q = cls(int(m["bits"]), m["act"], int(m["gs"] or 64))
        if q.bits not in (4, 8):
            raise DFlashError(f"draft quantization bits {q.bits} not supported: use 4 or 8")
        if q.group_size not in (32, 64, 128):
            raise DFlashError(f"draft quantization group size {q.group_size}: use 32, 64 or 128")
        return q

    @property
    def activation_dtype(self) -> mx.Dtype:
        return _ACTIVATIONS[self.activation]

    @property
    def fp16_activations(self) -> bool:
        return self.activation_dtype == mx.float16

    def __str__(self) -> str:
        return f"w{self.bits}a{self.activation}:gs{self.group_size}"


def _plan(drafter: nn.Module, quant: DraftQuant) -> dict:
    """mlx-lm-style `quantization` metadata: defaults plus per-module overrides."""
    meta = {"group_size": quant.group_size, "bits": quant.bits, "mode": "affine"}
    for path, module in drafter.named_modules():
        if not hasattr(module, "to_quantized"):
            continue
        if module.weight.shape[-1] % quant.group_size:
            meta[path] = False  # width not divisible by the group: keep it float
        elif isinstance(module, nn.Embedding) and quant.bits < CODEBOOK_MIN_BITS:
            meta[path] = {"group_size": quant.group_size, "bits": CODEBOOK_MIN_BITS, "mode": "affine"}
    return meta


def apply_saved_quantization(drafter: nn.Module, meta: dict) -> None:
    """Rebuild the quantized layers that `meta` describes (before loading weights)."""

    def predicate(path, module):
        if path in meta:
            return meta[path]
        return hasattr(module, "to_quantized")

    nn.quantize(drafter, meta["group_size"], meta["bits"], mode=meta.get("mode", "affine"),
                class_predicate=predicate)


def unpacked_width(width: int, meta: Optional[dict], path: str) -> int:
    """Input width of a layer whose packed weight has `width` columns."""
    if not meta or meta.get(path) is False:
        return width
    bits = (meta.get(path) or meta)["bits"]
    return width * 32 // bits


def is_quantized(module: nn.Module) -> bool:
    """Whether any layer of `module` already holds packed (quantized) weights."""
    return any(hasattr(m, "bits") for _, m in module.named_modules())


def quantize_drafter(drafter: nn.Module, quant: DraftQuant) -> dict:
    """Quantize in place; returns the metadata to save with it."""
    meta = _plan(drafter, quant)
    apply_saved_quantization(drafter, meta)
    drafter.set_dtype(quant.activation_dtype)
    mx.eval(drafter.parameters())
    return meta


def save_quantized_drafter(
    drafter: nn.Module, source_config: dict, meta: dict, quant: DraftQuant,
    source_folder: Path, out_folder: Path,
) -> Path:
    """Write a quantized drafter as a new folder, atomically.

    The source checkpoint is never touched; a failed save leaves nothing behind.
    """
    out_folder = Path(out_folder).expanduser().resolve()
    if out_folder == Path(source_folder).resolve():
        raise DFlashError("refusing to overwrite the original drafter: choose another output folder")
    if out_folder.exists():
        raise DFlashError(f"output folder '{out_folder}' already exists: remove it or choose another")
    parent = out_folder.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise DFlashError(f"cannot write into '{parent}': choose a writable output folder")
    config = dict(source_config)
    config["quantization"] = meta
    config["quantization_config"] = meta
    config["dflash2_mlx"] = {"draft_quant": str(quant), "activation_dtype": str(quant.activation_dtype).split(".")[-1]}
    try:
        # Not mkdtemp: its 0700 mode would carry over to the published folder.
        tmp = parent / f".{out_folder.name}.partial-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
    except OSError as e:
        raise DFlashError(f"cannot write into '{parent}' ({e.strerror}): choose a writable output folder") from e
    try:
        weights = dict(tree_flatten(drafter.parameters()))
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        os.replace(tmp, out_folder)
    except (OSError, RuntimeError) as e:  # disk full, quota: mlx reports write failures as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        raise DFlashError(
            f"could not write the quantized drafter to '{out_folder}' ({str(e).splitlines()[0]}): "
            "check free space and permissions"
        ) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_folder


def saved_activation_dtype(config: dict) -> Optional[mx.Dtype]:
    name = (config.get("dflash2_mlx") or {}).get("activation_dtype")
    return getattr(mx, name) if name else None
