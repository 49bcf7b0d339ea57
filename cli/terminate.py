"""SIGTERM ends a command the way Ctrl-C does, with its own line and status.

Standard library only: `entry` installs the handler before the heavy imports,
so a supervisor's SIGTERM during start-up is one line too. The handler raises
`Terminated` on the main thread wherever it is; like a KeyboardInterrupt it
unwinds through the atomic writes (files.py, train/export.py clean up on any
BaseException) and through `stdio.interrupts_deferred` (which holds it until a
write is whole), and the error boundary turns it into `error: terminated` and
status 143. It is not a KeyboardInterrupt, so nothing that treats Ctrl-C as
"stop this answer" (chat) carries on after it.

While an extension module initialises (mlx's core, numpy's) the exception is
held back: the initialiser turns any exception raised in it into an
ImportError, which would end the command as an "internal error" (or, caught by
an optional import, lose the signal). The handler then asks for the signal
again a moment later, until that import is done. `arrivals()` counts the
signals, so the boundary reports `terminated` whatever exception the unwinding
became.

`dflash2 serve` replaces the handler once it serves: there SIGTERM is the
ordinary stop (drain, then exit 0); during its start-up it is this one.
"""

import os
import signal
import sys
import threading

TERMINATED = 143  # what shells report for a process ended by SIGTERM (128 + 15)


class Terminated(BaseException):
    """The process got SIGTERM; it unwinds like Ctrl-C and exits 143."""


_arrivals = 0
REDELIVER_S = 0.02  # how soon a SIGTERM held back during an import is asked for again


def arrivals() -> int:
    """How many SIGTERMs this handler has taken (a count, not a flag, so that
    a command run in-process can ask "one since I started?")."""
    return _arrivals


def _held_back(frame) -> bool:
    """Whether an exception raised here would be mangled or lost: inside an extension's
    initialiser (it becomes an ImportError) or inside importlib's module-lock weakref
    callback (`cb`: Python prints "Exception ignored" and drops it: a Ctrl-C seen lost
    under load)."""
    from importlib.machinery import ExtensionFileLoader

    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib") and (
                frame.f_code.co_name == "cb" or isinstance(frame.f_locals.get("self"), ExtensionFileLoader)):
            return True
        frame = frame.f_back
    return False


def _ask_again(signum) -> None:
    timer = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def _interrupt(signum, frame):
    """Ctrl-C as Python's own handler, except where the KeyboardInterrupt would be lost."""
    if _held_back(frame):
        _ask_again(signum)
        return
    raise KeyboardInterrupt


def _terminate(signum, frame):
    global _arrivals
    _arrivals += 1
    if _held_back(frame):
        _ask_again(signum)
        return
    # The first SIGTERM decides; more while the clean-up runs change nothing
    # (a supervisor that insists sends SIGKILL).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def install() -> None:
    """SIGTERM raises `Terminated` from now on, and Ctrl-C its KeyboardInterrupt where
    it cannot be lost (main thread only: signals are handled there). An inherited
    ignored SIGINT stays ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupt)


def report_terminated() -> int:
    print("error: terminated", file=sys.stderr, flush=True)
    return TERMINATED
