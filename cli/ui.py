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
