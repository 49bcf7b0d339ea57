"""The installed `dflash2` command run as a real process: real exit status,
real stderr, real signals, and a check that it touched no file but its own.

Each start costs about a second of imports, so tests that need many cases run
them in-process through the `cli` fixture and keep one process per behaviour.
"""

import hashlib
import os
import re
import select
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

# The plain progress lines of `bench` and `analyze` off a terminal (cli/ui/progress.py).
PROGRESS_LINE = re.compile(r"^(bench|analyze) \[\d+/\d+\] ")


def dflash2_command() -> list[str]:
    """The `dflash2` command, found without PATH: the console script installed
    beside this interpreter, else the same entry run as `python -m dflash2_mlx.cli`
    (cli/__main__.py calls the entry point's `main`)."""
    for folder in dict.fromkeys((sysconfig.get_path("scripts"), os.path.dirname(sys.executable))):
        exe = os.path.join(folder, "dflash2")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return [exe]
    return [sys.executable, "-m", "dflash2_mlx.cli"]


@dataclass
class Result:
    code: int
    out: bytes
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()

    def one_error_line(self) -> str:
        """The single stderr line of a clean failure (asserts the shape). Progress lines
        that a long command prints off a terminal before it fails ("bench [3/3] done")
        are not part of the failure and are left out."""
        assert self.code != 0, (self.code, self.err)
        lines = [line for line in self.err_lines if not PROGRESS_LINE.match(line)]
        assert len(lines) == 1, self.err
        line = lines[0]
        assert line.startswith("error: ") and "internal error" not in line and "Traceback" not in self.err, line
        return line


def snapshot(*roots: Path) -> dict:
    """path -> sha256 (or 'dir') of everything under `roots`."""
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            out[str(p)] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def changed(before: dict, after: dict) -> set:
    return {p for p in set(before) | set(after) if before.get(p) != after.get(p)}


class Sandbox:
    """A working folder (also HOME and the caches) plus folders that must not change."""

    def __init__(self, root: Path, *watched: Path):
        self.root = Path(root)
        self.home = self.root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.watched = [self.root, *map(Path, watched)]
        self.env = {**os.environ, "HOME": str(self.home), "XDG_CACHE_HOME": str(self.home / ".cache"),
                    "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "100"}
        self.before = snapshot(*self.watched)

    def remember(self) -> None:
        """Take the current files as the ones that must not change."""
        self.before = snapshot(*self.watched)

    def touched(self) -> set:
        """Paths created, changed or deleted since the sandbox was made, except
        the tool's own calibration cache (--block-size auto writes it on first
        use, atomically, in the user's cache folder)."""
        cache = str(self.home / ".cache")
        return {p for p in changed(self.before, snapshot(*self.watched))
                if not (p == cache or p.startswith(cache + "/dflash2-mlx"))}

    def start(self, args, stdin=subprocess.DEVNULL, close_stdin=False, preexec=None) -> subprocess.Popen:
        def before_exec():
            # A test runner started in the background (`cmd &` in a script) may hand
            # down an ignored SIGINT, and Python then installs no Ctrl-C handler:
            # the command gets the disposition a terminal would give it.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if close_stdin:
                os.close(0)
            if preexec:
                preexec()

        return subprocess.Popen([*dflash2_command(), *map(os.fsencode, map(str_or_bytes, args))], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.root, env=self.env,
                                preexec_fn=before_exec)

    def run(self, args, input: bytes = None, **kw) -> Result:
        p = self.start(args, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL, **kw)
        out, err = p.communicate(input, timeout=180)
        return Result(p.returncode, out, err.decode(errors="replace"))

    def interrupt(self, args, wait, signum=signal.SIGINT) -> Result:
        """Start `args`, call `wait(proc)` (returns stdout bytes read so far), send `signum`."""
        p = self.start(args)
        early = wait(p)
        if p.poll() is None:
            p.send_signal(signum)
        out, err = p.communicate(timeout=180)
        return Result(p.returncode, early + out, err.decode(errors="replace"))


def str_or_bytes(a):
    return a if isinstance(a, bytes) else str(a)


def catching_sigint(proc, extra: float = 0.0) -> bytes:
    """Wait until the interpreter has installed its SIGINT handler (before that a
    Ctrl-C kills any program, Python or not), then `extra` seconds more."""
    return catching(proc, signal.SIGINT, extra, 0.3)


def catching(proc, sig: int, extra: float = 0.0, without_proc: float = 0.3) -> bytes:
    """Wait until `proc` has installed a handler for `sig` (before that the
    signal kills it), then `extra` seconds more; without /proc, sleep
    `without_proc` seconds instead of looking."""
    if not sys.platform.startswith("linux"):  # no /proc: the interpreter starts within this
        time.sleep(without_proc + extra)
        return b""
    status = Path(f"/proc/{proc.pid}/status")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            caught = next(line for line in status.read_text().splitlines() if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            caught = "SigCgt: 0"
        if int(caught.split()[1], 16) & (1 << (sig - 1)):
            break
        time.sleep(0.005)
    time.sleep(extra)
    return b""


def first_output(proc, timeout: float = 120) -> bytes:
    """Wait for the first bytes on stdout (the command is past start-up) and return them."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no output before the timeout"
    return os.read(proc.stdout.fileno(), 65536)
