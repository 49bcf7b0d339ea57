"""Where a result came from: the command that produced it and the commit of
the code that measured it, for the top of every result file (benchmarks/results/)."""

import shlex
import subprocess
from pathlib import Path
from typing import Optional, Sequence

# The checkout this package runs from, when it runs from one (an editable install).
CHECKOUT = Path(__file__).resolve().parents[2]


def git_commit(folder: Path = CHECKOUT) -> Optional[str]:
    """`git rev-parse --short HEAD` of the package's own checkout; None when the
    package is not running from a git checkout (a wheel) or git is missing."""
    if not (Path(folder) / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def command_line(program: str, args: Sequence[str]) -> str:
    """How to type the command again: `program` then its arguments as given."""
    return " ".join([program, *(shlex.quote(str(a)) for a in args)])


def provenance(command: str) -> dict:
    """The two keys a result file starts with: "command" and "commit"."""
    return {"command": command, "commit": git_commit()}
