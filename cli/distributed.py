"""Running a command as MLX distributed ranks, and what each rank does.

The process the user starts (the *parent*) re-runs the same command as N ranks
through `mlx.launch` (launch.py) and is the only one that speaks to the user
about failures. mlx.launch stops every rank once one exits non-zero, but it
exits 0 itself, prints `[WARN] Node with rank …` lines, and the ring backend
adds a burst of `[ring] …` lines on the survivors; a rank that hangs without
closing its sockets (a machine gone to sleep) is never noticed. So:

- each rank tags its one error line with its rank (`rank_error_prefix`), runs a
  watchdog that ends it when no target pass has started for `--rank-timeout`
  seconds while generating, and sends stdout to /dev/null unless it is rank 0;
- the parent reads the ranks' stderr through the launcher, passes ordinary
  lines on once (every rank prints the same warnings), swallows the launcher's
  and the backend's noise, and at the end prints ONE line naming the first
  cause (a rank's own error, a rank killed by a signal, or a lost peer) and
  exits non-zero.
"""

import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from dflash2_mlx.errors import DFlashError

from . import errors

# How a rank's error line starts: "[rank 1] error: ...". The parent parses it.
RANK_ERROR = re.compile(r"\[rank (\d+)\] error: (.*)$")
_LAUNCHER = re.compile(r"\[(WARN|INFO|ERROR)\]|Node with rank \d+ completed")
_NODE_EXIT = re.compile(r"Node with rank (\d+) exited with code (-?\d+)")
_NODE_KILLED = re.compile(r"Node with rank (\d+) was killed")
# The ring/JACCL backends' own messages when a peer goes away; the launcher can
# interleave two ranks' output mid-line, so match pieces, not line starts.
_BACKEND_NOISE = re.compile(r"\[(ring|jaccl)\]|[Ss]ocket \d+|errno \d+|send/recv errors")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOST_PEER = "lost contact with another rank"


def in_rank() -> bool:
    """Whether this process is a rank that mlx.launch started (it sets MLX_RANK)."""
    return "MLX_RANK" in os.environ


def wants_ranks(processes: Optional[int], hostfile: Optional[str]) -> bool:
    """Whether this (parent) process should start ranks instead of decoding."""
    return not in_rank() and (hostfile is not None or (processes or 1) > 1)


def relaunch(model: str, processes: Optional[int], hostfile: Optional[str], prompt: Optional[str] = None,
             relay_stdin: Optional[bytes] = None, serving: bool = False) -> None:
    """Run this same command as ranks. `prompt`, when given, replaces the
    command's --prompt (the parent has read stdin: the ranks' stdin never ends).
    A target on this disk that cannot be split is refused before any rank starts.
    `serving`: Ctrl-C / SIGTERM here reach the ranks as SIGTERM (rank 0 drains)."""
    from dflash2_mlx.loading.preflight import check_local_target_splits

    from .main import typed_args

    if processes is not None and hostfile is not None:
        raise DFlashError("give --processes or --hostfile, not both: the hostfile says how many ranks")
    check_local_target_splits(model, hostfile_ranks(hostfile) if hostfile else processes)
    argv = without_flags(typed_args(), ("--processes", "--hostfile"))
    if prompt is not None:
        argv = without_flags(argv, ("--prompt", "-p")) + [f"--prompt={prompt}"]
    run_distributed(argv, processes, hostfile, relay_stdin, serving)


# -- the parent ----------------------------------------------------------------------


def without_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` without the given value-taking flags (`--flag V` or `--flag=V`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out


@dataclass
class RankOutcome:
    """What the parent learnt from the ranks' stderr."""

    errors: dict[int, str] = field(default_factory=dict)  # rank -> its error message
    exits: dict[int, int] = field(default_factory=dict)  # rank -> exit code mlx.launch saw
    stopped: set[int] = field(default_factory=set)  # ranks the launcher terminated
    seen: set[str] = field(default_factory=set)  # ordinary lines already passed on
    first_failure: Optional[float] = None  # monotonic time the first failure was reported

    def failed_for(self) -> float:
        return 0.0 if self.first_failure is None else time.monotonic() - self.first_failure

    def feed(self, raw: str, out) -> None:
        # The launcher writes its own lines and the ranks' from two threads, so
        # pieces of one can land inside another: search, never anchor.
        line = _ANSI.sub("", raw).rstrip("\n")
        m = RANK_ERROR.search(line)
        if m:
            self.errors.setdefault(int(m.group(1)), m.group(2))
            self.first_failure = self.first_failure or time.monotonic()
            return
        if (e := _NODE_EXIT.search(line)):
            self.exits[int(e.group(1))] = int(e.group(2))
            if int(e.group(2)) != 0:
                self.first_failure = self.first_failure or time.monotonic()
            return
        if (k := _NODE_KILLED.search(line)):
            self.stopped.add(int(k.group(1)))
            return
        if _LAUNCHER.search(line) or _BACKEND_NOISE.search(line) or not line.strip():
            return
        if line not in self.seen:
            self.seen.add(line)
            out.write(line + "\n")
            out.flush()

    def failure(self, launcher_status: int) -> Optional[str]:
        """The one line to show, or None when every rank finished cleanly."""
        own = {r: m for r, m in self.errors.items() if LOST_PEER not in m and "[ring]" not in m}
        if own:
            messages = set(own.values())
            if len(messages) == 1 and len(own) > 1:  # every rank failed the same way
                return messages.pop()
            r = min(own)
            return f"rank {r}: {own[r]}"
        # mlx.launch reports exits in the order it sees them and SIGTERMs the
        # rest after the first failure: the first exit that is neither a lost
        # peer nor that SIGTERM is the cause.
        lost = {r for r, m in self.errors.items() if r not in own}
        failed = [(r, c) for r, c in self.exits.items() if c != 0 and r not in self.stopped]
        causes = ([(r, c) for r, c in failed if r not in lost and c != -signal.SIGTERM]
                  or [(r, c) for r, c in failed if r not in lost] or failed)
        if causes:
            r, c = causes[0]
            if c < 0:
                return (f"rank {r} was killed ({_signal_name(-c)}) during the run, so every rank was stopped: "
                        "check that process or machine (out of memory?) and run the command again")
            if r in self.errors:
                return f"rank {r}: {self.errors[r]}"
            return f"rank {r} exited with status {c}, so every rank was stopped"
        if self.errors:
            r = min(self.errors)
            return f"rank {r}: {self.errors[r]}"
        if launcher_status != 0:
            return f"mlx.launch exited with status {launcher_status} (see its message above)"
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def hostfile_ranks(hostfile: str) -> int:
    """How many ranks an mlx.launch hostfile lists (checked before launching)."""
    import json
    from pathlib import Path

    path = Path(hostfile)
    if not path.is_file():
        raise DFlashError(f"--hostfile '{hostfile}' does not exist: give the JSON host list mlx.launch takes")
    try:
        hosts = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DFlashError(f"--hostfile '{hostfile}' is not JSON: give the host list mlx.launch takes "
                          '(e.g. [{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...])') from None
    hosts = hosts.get("hosts", hosts) if isinstance(hosts, dict) else hosts
    if not isinstance(hosts, list) or len(hosts) < 1:
        raise DFlashError(f"--hostfile '{hostfile}' lists no hosts")
    return len(hosts)


# Once one rank has failed, how long the others get to end before they are killed.
GRACE_S = 5.0


def run_distributed(argv: list[str], processes: Optional[int], hostfile: Optional[str],
                    relay_stdin: Optional[bytes] = None, serving: bool = False) -> None:
    """Run `dflash2 ARGV` as ranks (N on this machine, or the hostfile's);
    returns when all ended cleanly, raises `DFlashError` with the one line otherwise."""
    from .ranks import run_ranks

    count = hostfile_ranks(hostfile) if hostfile else processes
    outcome = RankOutcome()
    status = run_ranks(count, argv, hostfile=hostfile, relay_stdin=relay_stdin,
                       on_stderr=lambda line: outcome.feed(line, sys.stderr),
                       give_up=lambda: outcome.failed_for() > GRACE_S, forward_signals=serving)
    message = outcome.failure(status)
    if message is not None:
        raise DFlashError(message)


# -- inside a rank -------------------------------------------------------------------


class Watchdog:
    """Ends this rank when it is armed and `progress()` has not changed for
    `timeout` seconds: a peer that stopped without closing its connection (a
    machine asleep) leaves a collective, or the group's first handshake,
    waiting forever. The main thread is then inside MLX, which releases the
    GIL, so this thread still runs."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._progress: Callable[[], int] = lambda: 0
        self._armed: Optional[str] = None  # the line to print when it fires
        self._lock = threading.Lock()
        self._last = (0, time.monotonic())
        threading.Thread(target=self._watch, daemon=True, name="dflash2-watchdog").start()

    def arm(self, message: Optional[str], progress: Optional[Callable[[], int]] = None) -> None:
        """Watch `progress` (kept when None); `message` None disarms."""
        with self._lock:
            if progress is not None:
                self._progress = progress
            self._armed = message
            self._last = (self._progress(), time.monotonic())

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            with self._lock:
                count, since = self._last
                now, current = time.monotonic(), self._progress()
                if current != count:
                    self._last = (current, now)
                    continue
                if self._armed is None or now - since < self.timeout:
                    continue
                message = self._armed
            errors.fail(message)
            sys.stderr.flush()
            os._exit(1)


@dataclass
class RankContext:
    group: object  # mx.distributed.Group
    watchdog: Watchdog

    @property
    def rank(self) -> int:
        return self.group.rank()

    def watch(self, target) -> None:
        """Arm the watchdog over `target`'s passes (a `ShardedTarget` counts them)."""
        self.watchdog.arm(f"{LOST_PEER}: no target pass finished for {self.watchdog.timeout:g} s (a machine "
                          "asleep or unplugged?); stopped. Raise --rank-timeout for very long prompts",
                          lambda: target.collectives.passes)

    def reader(self, read_line: Callable[[str], str], target) -> Callable[[str], str]:
        """`read_line` with the watchdog off while it waits for the user."""

        def read(prompt: str) -> str:
            self.watchdog.arm(None)
            try:
                return read_line(prompt)
            finally:
                self.watch(target)

        return read


# The start-up rendezvous waits for every rank to import MLX and mlx-lm, which
# takes seconds on a loaded machine: it has its own, longer deadline than a
# silent peer mid-generation (--rank-timeout).
START_TIMEOUT = 120.0


def start_rank(timeout: float) -> Optional[RankContext]:
    """Join the group mlx.launch set up (None for a group of one); only rank 0
    keeps its stdout. The watchdog covers the handshake: a rank that never
    shows up would leave the others waiting in it."""
    import mlx.core as mx

    errors.set_prefix(f"[rank {os.environ.get('MLX_RANK', '?')}] ")
    start = max(timeout, START_TIMEOUT)
    watchdog = Watchdog(start)
    watchdog.arm(f"could not reach the other ranks within {start:g} s: check the hostfile and that "
                 "every machine is up and reachable")
    try:
        group = mx.distributed.init(strict=True)
    except RuntimeError as e:
        raise DFlashError(f"could not join the distributed group ({str(e).splitlines()[0]}): "
                          "check the hostfile and that every machine can reach the others") from None
    # Loading may take minutes on a big target; its last step is a collective
    # that fails at once if a peer dies.
    watchdog.arm(None)
    watchdog.timeout = timeout  # from here on: a peer silent mid-generation
    if group.size() == 1:
        errors.set_prefix("")
        return None
    if group.rank() != 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        sys.stdout.flush()
        os.dup2(devnull, 1)
    return RankContext(group, watchdog)
