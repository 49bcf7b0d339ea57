"""Progress on stderr: train's bar (loss, recall, tokens/s), and bench's and analyze's
(a bar on a terminal, plain lines in a log or a pipe)."""

from __future__ import annotations

import time

from .style import err_console, status

PLAIN_EVERY_S = 10.0  # off a terminal: analyze's line per measurement (within one) and bench's, at most this often


class BarProgress:
    """A labelled progress bar on stderr with one free-text column; the base of
    train's and bench's bars. `auto_refresh=False` redraws only when told."""

    def __init__(self, label: str, total: int = None, done: int = 0, enabled: bool = True,
                 time_remaining: bool = False, auto_refresh: bool = True):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.enabled = enabled
        columns = [TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}")]
        if time_remaining:
            columns.append(TimeRemainingColumn())
        self._progress = Progress(*columns, console=err_console, auto_refresh=auto_refresh)
        self._label = label
        self._task = None if total is None else self._progress.add_task(label, total=total, completed=done, info="")
        self._printed = None  # when the last plain line was printed (off a terminal)

    def __enter__(self):
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._progress.stop()

    def report(self, done: int, total: int, info: str, force: bool = False) -> None:
        """Where the run is: the bar redrawn now on a terminal; elsewhere a plain line
        ("bench [3/24] ...") when `force`d or PLAIN_EVERY_S after the last one."""
        if self.enabled:
            self.set(done, total, info)
            self._progress.refresh()
            return
        now = time.monotonic()
        if force or self._printed is None or now - self._printed >= PLAIN_EVERY_S:
            self._printed = now
            status(f"{self._label} [{done}/{total}] {info}")

    def set(self, done: int, total: int, info: str) -> None:
        if self._task is None:
            self._task = self._progress.add_task(self._label, total=total, info="")
        self._progress.update(self._task, completed=done, total=total, info=info)


class TrainProgress(BarProgress):
    """Train's bar: loss, recall and tokens/s; notes print above it."""

    def __init__(self, total: int, done: int, enabled: bool = True):
        super().__init__("train", total, done, enabled, time_remaining=True)

    def step(self, event) -> None:
        info = (f"loss {event.loss:.3f} sel {event.selector_loss:.3f} recall {event.recall1:.3f} "
                f"{event.tokens_per_s:,.0f} tok/s lr {event.lr:.2e}")
        self.set(event.step, self._progress.tasks[0].total, info)

    def note(self, text: str) -> None:
        self._progress.console.print(f"[dim]{text}[/dim]")


def eval_line(event) -> str:
    r1 = " ".join(f"{x:.2f}" for x in event.recall1_by_position)
    rk = " ".join(f"{x:.2f}" for x in event.recallK_by_position)
    return f"eval @ {event.step}: loss {event.loss:.3f} | recall@1 by position {r1} | recall@K {rk}"


class RunProgress(BarProgress):
    """Bench's bar, redrawn only when told (between runs), so no refresh thread
    competes with the measurement; off a terminal a plain line between runs at
    most every PLAIN_EVERY_S (a bench of a real model on a CPU runs for minutes)."""

    def __init__(self):
        super().__init__("bench", enabled=err_console.is_terminal, auto_refresh=False)

    def update(self, done: int, total: int, info: str) -> None:
        self.report(done, total, info, force=done == total)


class AnalyzeProgress(BarProgress):
    """Analyze's progress, called with each `AnalyzeStep` the library reports.
    On a terminal a bar redrawn only when told (between units of work, so no
    refresh thread competes with the cycle timings); otherwise plain lines, one
    as each measurement starts and within one at most every PLAIN_EVERY_S, so a
    log of a minutes-long run shows where it is without a line per prompt."""

    def __init__(self):
        super().__init__("analyze", enabled=err_console.is_terminal, time_remaining=True, auto_refresh=False)
        self._phase = None

    def __call__(self, step) -> None:
        phase = (step.variant, step.measurement)
        self.report(step.done, step.total, step.label, force=phase != self._phase)
        self._phase = phase
