"""Progress bars on stderr: train's (loss, recall, tokens/s) and bench's (between runs)."""

from __future__ import annotations

from .style import err_console


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

    def __enter__(self):
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._progress.stop()

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
    competes with the measurement."""

    def __init__(self, enabled: bool = True):
        super().__init__("bench", enabled=enabled, auto_refresh=False)

    def update(self, done: int, total: int, info: str) -> None:
        if not self.enabled:
            return
        self.set(done, total, info)
        self._progress.refresh()
