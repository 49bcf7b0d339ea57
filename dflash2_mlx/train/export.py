"""Drafter configs for new drafters and export in the released checkpoint format."""

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from ..engine.drafter.config import DFLASH2_ARCH, DFLASH_ARCH, default_target_layer_ids
from ..errors import DFlashError


def new_drafter_config(target, kind: str, num_layers: int, block_size: int, mask_token_id: int,
                       selector_rank: int = 256, selector_top_k: int = 16,
                       target_layer_ids: Optional[list[int]] = None) -> dict:
    """A config.json for a fresh drafter shaped like `target` (z-lab layout, nested)."""
    args = target.args
    H = target.hidden_size
    heads = args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or H // heads
    ids = list(target_layer_ids) if target_layer_ids else default_target_layer_ids(target.num_layers, num_layers)
    config = {
        "architectures": [DFLASH2_ARCH if kind == "dflash2" else DFLASH_ARCH],
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": args.num_key_value_heads,
        "head_dim": head_dim,
        "rms_norm_eps": args.rms_norm_eps,
        "rope_theta": getattr(args, "rope_theta", None) or 10000.0,
        "max_position_embeddings": getattr(args, "max_position_embeddings", None) or 4096,
        "vocab_size": target.vocab_size,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "num_target_layers": target.num_layers,
        "layer_types": ["full_attention"] * num_layers,
        "dtype": "bfloat16",
        "dflash_config": {"block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": ids},
    }
    if kind == "dflash2":
        config["is_causal"] = False
        config["dflash_config"].update(
            conv_group_size=16, conv_kernel_size=2, selector_rank=selector_rank, selector_top_k=selector_top_k
        )
    return config


def upgraded_config(source: dict, selector_rank: int = 256, selector_top_k: int = 16) -> dict:
    """A DFlash v1 config.json as DFlash 2: the same backbone, every original key
    kept, the DFlash 2 keys added with the conv and selector at their defaults."""
    config = json.loads(json.dumps(source))
    config["architectures"] = [DFLASH2_ARCH]
    config["is_causal"] = False
    nested = config.setdefault("dflash_config", {})
    if "block_size" in config and "block_size" not in nested:
        nested["block_size"] = config["block_size"]
    nested.update(conv_group_size=16, conv_kernel_size=2, selector_rank=selector_rank,
                  selector_top_k=selector_top_k)
    return config


def released_weights(drafter, dtype=mx.bfloat16, codebook_suffix: bool = False) -> dict[str, mx.array]:
    """Parameters under the released names (codebooks without `.weight`,
    unless `codebook_suffix`: some exports keep it)."""
    out = {}
    for name, value in tree_flatten(drafter.parameters()):
        if not codebook_suffix and name.startswith("candidate_selector.") and name.endswith("_codebook.weight"):
            name = name[: -len(".weight")]
        out[name] = value.astype(dtype)
    return out


def atomic_write_folder(folder: Path, files: dict[str, object]) -> Path:
    """Write `files` (name -> dict of arrays or JSON-able object) as `folder`,
    replacing an earlier export only once the new one is complete."""
    folder = Path(folder)
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.mkdir()
    except OSError as e:
        raise DFlashError(f"cannot write into '{parent}' ({e.strerror}): choose a writable output folder") from None
    old = None
    try:
        for name, content in files.items():
            if name.endswith(".safetensors"):
                mx.save_safetensors(str(tmp / name), content, metadata={"format": "pt"})
            else:
                (tmp / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
        if folder.exists():
            old = parent / f".{folder.name}.{uuid.uuid4().hex[:8]}.old"
            os.replace(folder, old)
        os.replace(tmp, folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        # A Ctrl-C between the two renames must not leave no folder at all; one inside
        # the removal of the replaced folder must not leave half of it.
        if old is not None and old.exists():
            if folder.exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(old, folder)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def remove_folder(folder: Path) -> None:
    """Delete `folder` so that no interruption leaves it half there under its name:
    renamed away first (one atomic step), then removed."""
    folder = Path(folder)
    trash = folder.parent / f".{folder.name}.{uuid.uuid4().hex[:8]}.old"
    try:
        os.replace(folder, trash)
    except OSError:  # gone already, or not ours to move: removed in place, as before
        shutil.rmtree(folder, ignore_errors=True)
    finally:  # also when a signal lands just after the rename
        try:
            shutil.rmtree(trash, ignore_errors=True)
        except BaseException:  # a signal inside the removal: finish it, then let the signal go on
            shutil.rmtree(trash, ignore_errors=True)
            raise


def export_drafter(drafter, config: dict, folder) -> Path:
    """The drafter as a released-format checkpoint (vLLM / SGLang layout)."""
    return atomic_write_folder(Path(folder), {"model.safetensors": released_weights(drafter), "config.json": config})
