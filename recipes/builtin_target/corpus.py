"""Pick the CPython standard-library source files and split them train / held-out.

The corpus is the `.py` source of the running interpreter's stdlib, found through
`sysconfig` so the recipe works on any machine with a CPython install.

Held-out rule (whole modules, so evaluation never sees a file of a module it
trained on): a top-level stdlib module or package `m` (e.g. `json`, `argparse`,
`asyncio`) is held out when `sha1(m) % 20 == 0`. Its regression tests
(`test/test_m*`) are then dropped from training too, since they quote the
module's API heavily.

`test/` is otherwise included in training: it more than doubles the data
(about 8.6M vs 3.5M tokens), and at our token budget a 3.5M-token corpus would
be repeated ~6 times, so the extra, still genuinely-Python text is worth more
than keeping test code out. Evaluation only ever uses non-test held-out modules.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from pathlib import Path

HOLDOUT_MOD = 20

# Top-level entries that are not stdlib Python source we want to learn from:
# third-party packages, the IDLE GUI, the huge generated pydoc topic dump,
# machine-specific sysconfig data and build config.
EXCLUDED_TOP = {"site-packages", "dist-packages", "idlelib", "pydoc_data", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_key(rel: Path) -> str:
    """Top-level module name of a stdlib file (`json/decoder.py` -> `json`)."""
    first = rel.parts[0]
    return first[:-3] if first.endswith(".py") else first


def is_held_out(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % HOLDOUT_MOD == 0


def _skip(rel: Path, text: str) -> bool:
    parts = rel.parts
    if parts[0] in EXCLUDED_TOP or parts[0].startswith(("config-", "_sysconfigdata")):
        return True
    if "__pycache__" in parts:
        return True
    # lib2to3's test data is deliberately Python 2 / broken syntax.
    if parts[0] == "lib2to3" and "tests" in parts:
        return True
    # Codec tables are ~256-entry literal tuples of escapes: 1/3 of the non-test
    # stdlib bytes but no programming content.
    if parts[0] == "encodings" and "decoding_table = (" in text:
        return True
    return False


def collect() -> dict:
    """Return {"root", "train": [rel...], "heldout": [rel...], "heldout_modules": [...]}."""
    root = stdlib_root()
    train, heldout = [], []
    held_keys = set()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test files are deliberately in other encodings
        if _skip(rel, text):
            continue
        files.append(rel)
        if rel.parts[0] != "test" and is_held_out(module_key(rel)):
            held_keys.add(module_key(rel))
    for rel in files:
        if rel.parts[0] == "test":
            # test/test_json/..., test/test_argparse.py -> tests of `json`, `argparse`
            name = rel.parts[1] if len(rel.parts) > 1 else ""
            stem = name[:-3] if name.endswith(".py") else name
            if stem.startswith("test_") and any(
                stem == f"test_{k}" or stem.startswith(f"test_{k}_") for k in held_keys
            ):
                continue  # tests of a held-out module: neither train nor eval
            train.append(rel)
        elif module_key(rel) in held_keys:
            heldout.append(rel)
        else:
            train.append(rel)
    return {
        "root": str(root),
        "python": sys.version.split()[0],
        "rule": f"top-level module m held out iff int(sha1(m).hexdigest(),16) % {HOLDOUT_MOD} == 0",
        "heldout_modules": sorted(held_keys),
        "train": [str(r) for r in train],
        "heldout": [str(r) for r in heldout],
    }


def read(root: str, rels: list[str]) -> list[str]:
    return [(Path(root) / r).read_text(encoding="utf-8") for r in rels]


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    info = collect()
    summary = {k: v for k, v in info.items() if k not in ("train", "heldout")}
    summary.update(train_files=len(info["train"]), heldout_files=len(info["heldout"]))
    print(json.dumps(summary, indent=1))
    if out:
        out.write_text(json.dumps(info, indent=1))
