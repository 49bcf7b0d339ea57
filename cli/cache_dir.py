"""`--cache-dir` (serve, chat): the prompt cache's disk tier, checked before loading."""

from pathlib import Path
from typing import Annotated, Optional

import typer

CacheDir = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help="Keep prompt-cache blocks on disk in this folder, across restarts (docs/prompt-cache.md).")]


def check_cache_dir(folder: Path) -> None:
    """Refuse a --cache-dir that is a file or cannot be created, before loading."""
    from dflash2_mlx.errors import DFlashError

    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise DFlashError(f"--cache-dir '{path}' is a file: give a folder (it is created when missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DFlashError(f"cannot create --cache-dir '{path}' ({e.strerror}): choose a writable folder") from None
