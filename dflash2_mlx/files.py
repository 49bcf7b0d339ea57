"""Result files are written whole or not at all."""

import os
from pathlib import Path

from .errors import DFlashError


def atomic_write_text(path, text: str) -> Path:
    """Write `text` to `path` via a temporary file and a rename."""
    path = Path(path).expanduser()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DFlashError(f"cannot write '{path}' ({e.strerror}): choose a writable location") from None
    return path
