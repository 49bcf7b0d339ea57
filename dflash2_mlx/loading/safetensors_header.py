"""A safetensors file checked from its header before anything loads it.

MLX reports a short file as "invalid data offsets" (a RuntimeError, from deep
inside the loader); reading the 8-byte length and the JSON header ourselves
gives the one line a user can act on, for targets and drafters alike.
"""

import json
from pathlib import Path

from ..errors import CheckpointError

_MAX_HEADER = 100 * 2**20  # safetensors' own limit


def check_safetensors(path: Path, what: str) -> None:
    """Raise CheckpointError when `path` is not a whole safetensors file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = f.read(n) if 0 < n <= min(_MAX_HEADER, size - 8) else b""
    except OSError as e:
        raise CheckpointError(f"{what} weights '{path}' cannot be read ({e.strerror})") from None
    if n < 0 or n > size - 8:
        raise CheckpointError(f"{what} weights '{path}' are truncated or corrupt (the header is cut short at "
                              f"{size:,} bytes): download them again")
    try:
        tensors = json.loads(header)
        ends = [t["data_offsets"][1] for name, t in tensors.items() if name != "__metadata__"]
        needed = 8 + n + max(ends, default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise CheckpointError(f"{what} weights '{path}' are truncated or corrupt (not a safetensors header): "
                              "download them again") from None
    if not isinstance(needed, int):
        raise CheckpointError(f"{what} weights '{path}' are truncated or corrupt (bad tensor offsets): "
                              "download them again")
    if needed > size:
        raise CheckpointError(f"{what} weights '{path}' are truncated or corrupt ({size:,} of {needed:,} bytes): "
                              "download them again")
