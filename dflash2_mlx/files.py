"""Result files are written whole or not at all, and checked before the work."""

import os
import uuid
from pathlib import Path

from .errors import DFlashError


def atomic_write_text(path, text: str) -> Path:
    """Write `text` to `path` via a temporary file and a rename."""
    return atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write `data` to `path` via a temporary file and a rename. The temporary name is
    this writer's own: two processes writing one file (two servers calibrating at once)
    each rename a whole file, and the last one wins, instead of one renaming the other's
    half-written file away from under it."""
    path = Path(path).expanduser()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DFlashError(f"cannot write '{path}' ({e.strerror}): choose a writable location") from None
    except BaseException:  # Ctrl-C: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_writable(path, what: str = "output file") -> None:
    """Raise DFlashError unless `atomic_write_text(path, ...)` can succeed later.

    Called before minutes of work, so a typo in a result path does not throw the
    results away. Leaves nothing behind: the missing folders `atomic_write_text`
    would create are not created here; a probe file in the nearest existing one is
    made and removed.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise DFlashError(f"{what} '{path}' is a folder: give a file name")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise DFlashError(f"cannot write {what} '{path}': '{folder}' is a file, not a folder")
    probe = folder / f".{path.name}.probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.unlink(probe)
    except OSError as e:
        raise DFlashError(f"cannot write {what} '{path}' ({e.strerror}): choose a writable location") from None
