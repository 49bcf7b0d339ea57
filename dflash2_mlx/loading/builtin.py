"""The built-in model pair that ships inside the package (see recipes/)."""

from pathlib import Path

from ..errors import CheckpointError

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "builtin"
# Drafters by name: the 4M pair's, and those trained for named sources (loading/sources.py).
BUILTIN_NAMES = {"target": {"builtin": "target"},
                 "drafter": {"builtin": "dflash2", "builtin-dflash": "dflash",
                             "smollm2": "smollm2-dflash2", "smollm2-dflash": "smollm2-dflash"}}


def resolve_builtin(ref: str, what: str) -> str:
    """Map `builtin` names to the folders shipped inside the package."""
    sub = BUILTIN_NAMES[what].get(ref)
    if sub is None:
        return ref
    folder = BUILTIN_DIR / sub
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"the built-in {what} '{ref}' is not bundled with this install: pass --model and --drafter "
            "(a Hub repo id or a local folder)"
        )
    return str(folder)
