"""Run this same command as N data-parallel ranks through MLX's own launcher.

`mlx.launch` relays each rank's output with select() loops that never block:
every child's stdin pipe is always writable, and an exhausted stdin of the
launcher itself is always readable. Its relay threads therefore spin and take
a core away from the ranks; on this 2-core machine two ranks ran no faster
than one (benchmarks/results/train-dp-cpu.json has the measurement). So we keep the
launcher's stdin open (it then waits on it) and, once every rank has started,
lower the launcher's own priority. Ranks keep theirs; the launcher still
relays output and tears the job down when a rank fails.
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

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


def run_ranks(processes: Optional[int], argv: list[str], wait_for_ranks_s: float = 60.0, *,
              hostfile: Optional[str] = None, on_stderr: Optional[Callable[[str], None]] = None,
              relay_stdin: Optional[bytes] = None, give_up: Optional[Callable[[], bool]] = None,
              forward_signals: bool = False) -> int:
    """Run `python -m dflash2_mlx.cli ARGV` as `processes` ring ranks on this
    machine, or as the ranks `hostfile` lists (mlx.launch's format and backend);
    returns the launcher's exit status.

    `on_stderr(line)`, when given, receives the ranks' stderr line by line
    instead of the terminal. `relay_stdin`, when given, copies this process's
    stdin line by line to every rank (the launcher broadcasts it) and sends that
    line at its end: mlx.launch never closes the ranks' stdin, so they see no EOF. `give_up()`, polled
    while the ranks run, may end the run: mlx.launch can wait forever on a rank
    that does not die when told to (a stopped process), so then every process
    under the launcher is killed. `forward_signals`: the launcher runs in its
    own session and SIGINT / SIGTERM here are sent on as SIGTERM to the ranks
    only (the launcher would die of them at once and orphan its ranks); this
    process then waits for the ranks to end as usual.
    """
    # Ranks on this machine listen on ports free now: mlx.launch's fixed default port made two
    # runs at once (two commands, or tests in parallel) connect to each other's ranks and hang.
    where = ["--hostfile", hostfile] if hostfile else ["-n", str(processes), "--backend", "ring",
                                                      "--starting-port", str(_free_ports(processes))]
    command = [launcher_path(), *where, sys.executable, "-m", "dflash2_mlx.cli", *argv]
    launcher = subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=forward_signals,
                                stderr=subprocess.PIPE if on_stderr else None)
    if forward_signals:
        def forward(*_):
            for child in _children(launcher.pid):  # the ranks (mlx.launch execs them)
                try:
                    os.kill(child, signal.SIGTERM)
                except OSError:
                    pass

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, forward)
    reader = _start(_read_lines, launcher.stderr, on_stderr) if on_stderr else None
    if relay_stdin is not None:
        _start(_copy_stdin, launcher.stdin, relay_stdin)  # daemon: may stay blocked on the user's terminal
    try:
        deadline = time.monotonic() + wait_for_ranks_s
        lowered = False
        while launcher.poll() is None:
            # Lower the launcher only after its ranks exist: they would inherit it.
            if not lowered and (len(_children(launcher.pid)) >= (processes or 1) or time.monotonic() > deadline):
                _deprioritize(launcher.pid)
                lowered = True
            if give_up is not None and give_up():
                _kill_tree(launcher.pid)
                break
            time.sleep(0.2)
        status = launcher.wait()
        if reader is not None:
            reader.join(timeout=5)
        return status
    except KeyboardInterrupt:
        launcher.terminate()
        launcher.wait()
        raise
    finally:
        if launcher.stdin and relay_stdin is None:
            launcher.stdin.close()


def _free_ports(n: int) -> int:
    """A port p with p .. p + n - 1 free on this machine now."""
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        try:
            for q in range(p, p + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise DFlashError(f"no {n} consecutive free ports on this machine for the ranks: close some servers and retry")


def _descendants(pid: int) -> list[int]:
    out = []
    for child in _children(pid):
        out += [child, *_descendants(child)]
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL the launcher and every process under it (a stopped one too)."""
    for p in [*_descendants(pid), pid]:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(p, sig)
            except OSError:  # already gone
                pass


def _start(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def _read_lines(stream, on_line) -> None:
    for raw in iter(stream.readline, b""):
        on_line(raw.decode(errors="replace"))


def _copy_stdin(pipe, last: bytes) -> None:
    """The user's input, line by line, to the launcher (which sends it to every rank)."""
    try:
        for line in iter(sys.stdin.buffer.readline, b""):
            pipe.write(line)
            pipe.flush()
        pipe.write(last)
        pipe.flush()
    except (BrokenPipeError, ValueError, OSError):  # the ranks are gone
        pass
