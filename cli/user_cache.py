"""The user cache folder: calibrations, exactness verdicts, converted and fetched models."""

from pathlib import Path


def cache_folder() -> Path:
    """Where calibrations are kept: the platform's user cache folder, then dflash2-mlx."""
    import os
    import sys

    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dflash2-mlx"
