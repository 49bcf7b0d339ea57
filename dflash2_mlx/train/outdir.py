"""What a training run may find in, and delete from, its output folder.

A run writes OUT/metrics.jsonl, OUT/checkpoints/step-NNNNNNN/ (rotated),
OUT/checkpoints/latest/, OUT/drafter/ and, with --patience, OUT/best/ (the best
evaluated weights). Rotation and export replace or
delete folders, so they must only ever meet what this tool wrote: a
checkpoint is recognised by its own state.json, and any other entry makes the
run refuse the folder before it starts.
"""

import json
import re
from pathlib import Path
from typing import Optional

from ..errors import DFlashError

CHECKPOINT_FORMAT = "dflash2-train-checkpoint/1"
_LEGACY_STATE_KEYS = {"step", "config", "drafter_config"}  # state.json before the format key
_STEP_NAME = re.compile(r"^step-(\d{7,})$")
# Leftovers of an interrupted atomic write (export.atomic_write_folder) and
# other ranks' write probes (setup.prepare).
_OWN_LEFTOVER = re.compile(r"^\.(step-\d{7,}|latest|drafter|best)\.[0-9a-f]{8}\.(tmp|old)$|^\.write-test-\d+$")
EXPORT_FILES = {"config.json", "model.safetensors"}
# The best evaluated weights of a --patience run (trainer.py's _keep_if_best writes them).
BEST, BEST_WEIGHTS, BEST_STATE = "best", "drafter.safetensors", "state.json"


def checkpoint_step(folder: Path) -> Optional[int]:
    """The step of a checkpoint this tool wrote, or None for anything else."""
    m = _STEP_NAME.match(folder.name)
    if not m or not folder.is_dir():
        return None
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    if state.get("format") != CHECKPOINT_FORMAT and set(state) != _LEGACY_STATE_KEYS:
        return None
    return state["step"] if state.get("step") == int(m[1]) else None


def own_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of this tool's checkpoints, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = ((checkpoint_step(p), p) for p in ckpt_dir.iterdir())
    return sorted((step, p) for step, p in found if step is not None)


def _is_pointer(folder: Path) -> bool:
    if not folder.is_dir() or {p.name for p in folder.iterdir()} != {"pointer.json"}:
        return False
    try:
        return isinstance(json.loads((folder / "pointer.json").read_text(encoding="utf-8")).get("folder"), str)
    except (OSError, ValueError, AttributeError):
        return False


def _is_export(folder: Path) -> bool:
    return folder.is_dir() and {p.name for p in folder.iterdir()} <= EXPORT_FILES


def foreign_entry(out_dir: Path) -> Optional[str]:
    """The first entry of `out_dir` this tool did not write (a relative path), or None."""
    if not out_dir.is_dir():
        return None
    for p in sorted(out_dir.iterdir()):
        if _OWN_LEFTOVER.match(p.name) or (p.name == "metrics.jsonl" and p.is_file()):
            continue
        if p.name == "drafter":
            if not _is_export(p):
                extra = sorted(q.name for q in p.iterdir() if q.name not in EXPORT_FILES) if p.is_dir() else []
                return f"drafter/{extra[0]}" if extra else "drafter"
            continue
        if p.name == BEST and p.is_dir() and {q.name for q in p.iterdir()} <= {BEST_WEIGHTS, BEST_STATE}:
            continue  # a patience run's best evaluation, which its resumed run still needs
        if p.name == "checkpoints" and p.is_dir():
            for c in sorted(p.iterdir()):
                if not (_OWN_LEFTOVER.match(c.name) or checkpoint_step(c) is not None
                        or (c.name == "latest" and _is_pointer(c))):
                    return f"checkpoints/{c.name}"
            continue
        return p.name
    return None


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output folder holding anything this tool did not write."""
    entry = foreign_entry(out_dir)
    if entry is not None:
        raise DFlashError(
            f"output folder '{out_dir}' holds '{entry}', which dflash2 train did not write and would "
            "replace or delete: pass a new or empty --out (or move it away)"
        )


def check_export_target(folder: Path) -> None:
    """The export replaces `folder` whole: only ever an earlier export."""
    if folder.exists() and not _is_export(folder):
        extra = sorted(q.name for q in folder.iterdir() if q.name not in EXPORT_FILES) if folder.is_dir() else []
        what = f"'{folder / extra[0]}'" if extra else f"'{folder}' (not a folder)"
        raise DFlashError(f"refusing to replace '{folder}': it holds {what}, which dflash2 train did not write; "
                          "move it away and rerun the same command (training resumes from the last checkpoint)")
