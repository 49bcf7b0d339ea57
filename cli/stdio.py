"""The standard streams as the CLI meets them: closed, not UTF-8, interrupted.

Standard library (and the library's error type) only: `entry` uses this module
before the heavy imports.
"""

import os
import signal
import sys
import threading
from contextlib import contextmanager

from dflash2_mlx.errors import DFlashError

INTERRUPTED = 130  # what shells report for a process ended by Ctrl-C (128 + SIGINT)
_closed: set[int] = set()


def reopen_closed_streams() -> None:
    """Put /dev/null on any closed fd 0, 1 or 2, remembering which were closed.

    Otherwise the next file opened (a model's weights) gets fd 0 and MLX
    reports it as unreadable; and output to a closed stream is discarded, as
    the user asked, instead of failing half way.
    """
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        opened = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one
        if opened != fd:
            os.dup2(opened, fd)
            os.close(opened)
        _closed.add(fd)
        if fd:
            setattr(sys, name, open(fd, "w", encoding="utf-8", closefd=False))


def report_interrupted() -> int:
    print("error: interrupted", file=sys.stderr)
    return INTERRUPTED


def check_text(value, what: str):
    """`value` unchanged, or one error naming `what` when it is not UTF-8.

    Python hands undecodable argv bytes over as lone surrogates
    (surrogateescape); they would fail later, deep in the tokenizer."""
    if value is None:
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start]
        offset = len(value[: e.start].encode("utf-8", "surrogateescape"))
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
        raise DFlashError(f"{what} is not valid UTF-8 text ({byte} at byte {offset}): "
                          "pass UTF-8 (check the terminal's or the file's encoding)") from None
    return value


def read_stdin(what: str = "the prompt on standard input") -> str:
    """All of stdin as text, decoded strictly as UTF-8."""
    if 0 in _closed or sys.stdin is None:
        raise DFlashError("standard input is closed: pipe the prompt in, or pass --prompt TEXT")
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream handed in by a caller (tests)
        return check_text(sys.stdin.read(), what)
    data = raw.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DFlashError(f"{what} is not valid UTF-8 text (byte 0x{data[e.start]:02x} at byte {e.start}): "
                          "pass UTF-8 (check the file's encoding)") from None


@contextmanager
def interrupts_deferred():
    """A Ctrl-C (or a SIGTERM the CLI handles, terminate.py) inside the block
    takes effect when it ends.

    The Python-level handler is swapped rather than the signal masked: any of
    MLX's threads may receive the signal, and CPython runs the handler on the
    main thread wherever it arrived. SIGTERM is held only when a Python
    handler is installed (left at its default it must still end the process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []

    def record(signum, frame):
        pending.append(signum)

    held = [signal.SIGINT] + [signal.SIGTERM] * callable(signal.getsignal(signal.SIGTERM))
    previous = {sig: signal.signal(sig, record) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in (signal.SIGTERM, signal.SIGINT):  # SIGTERM wins: it ends the command either way
            if sig in pending and callable(previous.get(sig)):  # Python's default SIGINT handler raises KeyboardInterrupt
                previous[sig](sig, None)


def write_whole(text: str, stream=None) -> None:
    """Write and flush `text` so that a Ctrl-C leaves all of it or none."""
    stream = stream or sys.stdout
    with interrupts_deferred():
        stream.write(text)
        stream.flush()
