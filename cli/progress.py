"""The prefill's progress line (generate, chat)."""

import sys

PREFILL_QUIET_S = 2.0  # a prefill shorter than this draws nothing


class PrefillProgress:
    """The library's `prompt_progress_callback` drawn as one muted line on stderr,
    redrawn in place once the prefill has run for PREFILL_QUIET_S, erased when
    it ends or when the `with` block around the generation exits (an error or
    Ctrl-C), so the next line starts clean. Inert (`callback` None) unless
    stderr is a terminal."""

    def __init__(self, stream=None, clock=None):
        import time

        self.stream, self.clock = stream, clock or time.monotonic
        self.started, self.drawn = None, False

    @classmethod
    def on_stderr(cls) -> "PrefillProgress":
        import os

        tty = sys.stderr is not None and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
        return cls(sys.stderr if tty else None)

    @property
    def callback(self):
        return self if self.stream is not None else None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if done == 0 or self.started is None:
            self.started = now
        if done >= total:
            self.clear()
            return
        if now - self.started < PREFILL_QUIET_S:
            return
        # Short, so that it never wraps (a carriage return redraws one row only).
        self.stream.write(f"\r\x1b[2mprefill {done:,} / {total:,} tokens ({100 * done // total} %)\x1b[0m\x1b[K")
        self.stream.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False

    def __enter__(self) -> "PrefillProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.clear()
