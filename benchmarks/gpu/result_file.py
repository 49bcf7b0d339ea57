"""The check's one JSON file, complete after every piece of work.

Every step of the check is its own process (one that crashes or runs out of
time takes nothing else with it) and writes its section through `put`: read the
file, set the section, recompute the verdicts, rename a temporary file over it.
A step killed at any moment leaves the earlier results whole. Steps run one
after the other, so nothing else writes the file meanwhile.
"""

import json
from pathlib import Path
from typing import Sequence, Union

from verdicts import verdicts

from dflash2_mlx.files import atomic_write_text


def read(path) -> dict:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def put(path, keys: Union[str, Sequence[str]], value) -> dict:
    """Set record[k1][k2]... = value (missing levels made) and write the file whole."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    record = read(path)
    node = record
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    record["verdicts"] = verdicts(record)
    atomic_write_text(path, json.dumps(record, indent=1, default=str) + "\n")
    return record
