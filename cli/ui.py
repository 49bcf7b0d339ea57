"""All Rich code lives here; everything else hands it plain data."""

import sys

from rich.console import Console

from dflash2_mlx.stats import GenerationStats

err_console = Console(stderr=True, highlight=False)


def stream_text(text: str) -> None:
    # Raw stdout, not Rich: streamed code must keep its exact characters.
    sys.stdout.write(text)
    sys.stdout.flush()


def closing_lines(stats: GenerationStats) -> list[str]:
    """mlx-lm's closing lines, plus llama.cpp's acceptance line when drafting."""
    lines = [
        f"Prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.3f} tokens-per-sec",
        f"Generation: {stats.generation_tokens} tokens, {stats.generation_tps:.3f} tokens-per-sec",
        f"Peak memory: {stats.peak_memory_gb:.3f} GB",
    ]
    if stats.mode != "ar":
        rates = ", ".join(f"{r:.2f}" for r in stats.acceptance_by_position)
        lines.append(
            f"draft acceptance = {stats.acceptance_rate:.2f} ({stats.accepted} accepted / "
            f"{stats.drafted} drafted), mean acceptance length = {stats.mean_acceptance_length:.2f}, "
            f"acceptance rate per position = ({rates})"
        )
    lines.append(f"[{stats.mode}, block {stats.block_size}, {stats.target_passes} target passes, backend {stats.backend}]")
    return lines


def print_closing(stats: GenerationStats) -> None:
    sys.stdout.write("\n==========\n")
    for line in closing_lines(stats):
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def status(message: str) -> None:
    err_console.print(f"[dim]{message}[/dim]")


class TrainProgress:
    """A progress bar with loss, recall and tokens/s; notes print above it."""

    def __init__(self, total: int, done: int, enabled: bool = True):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=err_console,
        )
        self._task = self._progress.add_task("train", total=total, completed=done, info="")

    def __enter__(self):
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._progress.stop()

    def step(self, event) -> None:
        info = (f"loss {event.loss:.3f} sel {event.selector_loss:.3f} recall {event.recall1:.3f} "
                f"{event.tokens_per_s:,.0f} tok/s lr {event.lr:.2e}")
        self._progress.update(self._task, completed=event.step, info=info)

    def note(self, text: str) -> None:
        self._progress.console.print(f"[dim]{text}[/dim]")


def eval_line(event) -> str:
    r1 = " ".join(f"{x:.2f}" for x in event.recall1_by_position)
    rk = " ".join(f"{x:.2f}" for x in event.recallK_by_position)
    return f"eval @ {event.step}: loss {event.loss:.3f} | recall@1 by position {r1} | recall@K {rk}"
