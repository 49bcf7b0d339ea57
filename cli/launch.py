"""Run this same command as N data-parallel ranks through MLX's own launcher.

`mlx.launch` relays each rank's output with select() loops that never block:
every child's stdin pipe is always writable, and an exhausted stdin of the
launcher itself is always readable. Its relay threads therefore spin and take
a core away from the ranks; on this 2-core machine two ranks ran no faster
than one (docs/results/train-dp-cpu.json has the measurement). So we keep the
launcher's stdin open (it then waits on it) and, once every rank has started,
lower the launcher's own priority. Ranks keep theirs; the launcher still
relays output and tears the job down when a rank fails.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dflash2_mlx.errors import DFlashError


def launcher_path() -> str:
    found = shutil.which("mlx.launch") or str(Path(sys.executable).with_name("mlx.launch"))
    if not Path(found).exists():
        raise DFlashError("mlx.launch was not found next to this Python: reinstall mlx (pip install mlx)")
    return found


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _deprioritize(pid: int) -> None:
    """Lowest priority for the launcher only. Linux applies setpriority per
    thread, so every thread of the process is lowered; macOS applies it to the
    whole process."""
    tasks = Path(f"/proc/{pid}/task")
    ids = [int(t.name) for t in tasks.iterdir()] if tasks.exists() else [pid]
    for tid in ids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
        except OSError:  # the thread ended meanwhile
            pass


def run_ranks(processes: int, argv: list[str], wait_for_ranks_s: float = 60.0) -> int:
    """Run `python -m dflash2_mlx.cli ARGV` as `processes` ring ranks on this
    machine; returns the launcher's exit status."""
    command = [launcher_path(), "-n", str(processes), "--backend", "ring",
               sys.executable, "-m", "dflash2_mlx.cli", *argv]
    launcher = subprocess.Popen(command, stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + wait_for_ranks_s
        # Lower the launcher only after its ranks exist: they would inherit it.
        while launcher.poll() is None and time.monotonic() < deadline:
            if len(_children(launcher.pid)) >= processes:
                _deprioritize(launcher.pid)
                break
            time.sleep(0.2)
        return launcher.wait()
    except KeyboardInterrupt:
        launcher.terminate()
        launcher.wait()
        raise
    finally:
        if launcher.stdin:
            launcher.stdin.close()
