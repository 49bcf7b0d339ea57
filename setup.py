"""Package discovery for setuptools (the metadata lives in pyproject.toml).

The package is built from three source folders: `dflash2_mlx/`, and `cli/` and
`metal/`, which install inside it (as `dflash2_mlx.cli` and `dflash2_mlx.metal`,
so nothing named `cli` or `metal` lands in site-packages). pyproject's
`packages.find` cannot map a folder to another name, and a hand-written list
forgets folders (`engine/batch` was left out of the wheel that way), so every
folder under these roots that holds a Python file is a package here.
tests/test_architecture.py checks a built wheel against the tree.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
SOURCES = {"dflash2_mlx": "dflash2_mlx", "cli": "dflash2_mlx.cli", "metal": "dflash2_mlx.metal"}


def packages() -> list[str]:
    found = set()
    for folder, name in SOURCES.items():
        for source in (ROOT / folder).rglob("*.py"):
            parts = source.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in parts:
                found.add(".".join([name, *parts]))
    return sorted(found)


setup(packages=packages(), package_dir={name: folder for folder, name in SOURCES.items()})
