"""What `dflash2 generate` prints: streamed text, the built-in pair's notice and
mlx-lm's closing lines.

Plain stdout, no Rich: streamed code must keep its exact characters, and the
most common command should not pay for importing Rich (the cli/ui/ package
re-exports these for the other commands).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the library loads MLX: not needed to print
    from dflash2_mlx.text.stats import GenerationStats


def note(message: str) -> None:
    """A muted note on stderr: one line whatever the width, dim on a terminal,
    never read as markup (`ui.status` for the Rich commands)."""
    dim = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    sys.stderr.write(f"\x1b[2m{message}\x1b[0m\n" if dim else f"{message}\n")
    sys.stderr.flush()


@contextmanager
def timed_note(message: str, enabled: bool = True):
    """One muted line on stderr for a slow step, finished with its time when it
    ends: `message… 3.2 s`. Only for people watching (stderr a terminal; logs
    and pipes get nothing, as `ui.progress_note`); an interruption ends the
    line, so the error line that follows starts on its own."""
    if not enabled or not sys.stderr.isatty():
        yield
        return
    dim = os.environ.get("TERM") != "dumb"
    on, off = ("\x1b[2m", "\x1b[0m") if dim else ("", "")
    sys.stderr.write(f"{on}{message}… ")
    sys.stderr.flush()
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        sys.stderr.write(f"{off}\n")
        sys.stderr.flush()
        raise
    sys.stderr.write(f"{time.perf_counter() - start:.1f} s{off}\n")
    sys.stderr.flush()


def measuring_costs(needed: bool):
    """The note `--block-size auto` prints while it measures a pair's decode
    costs (`inputs.calibrate`, when there is no calibration cached yet)."""
    return timed_note("measuring decode costs for this pair (--block-size auto)", needed)


def builtin_notice(target) -> str:
    """Why the built-in pair's text reads oddly (its size counted, not typed in)."""
    from mlx.utils import tree_flatten

    params = sum(v.size for _, v in tree_flatten(target.model.parameters()))
    return (f"the built-in pair is a demo: a {params / 1e6:.1f}M-parameter target trained on the Python standard "
            "library, so expect odd text; pass --model and --drafter for a real pair")


def stream_text(text: str) -> None:
    # Raw stdout, not Rich: streamed code must keep its exact characters.
    sys.stdout.write(text)
    sys.stdout.flush()


def closing_lines(stats: GenerationStats, exactness: str | None = None) -> list[str]:
    """mlx-lm's closing lines, plus llama.cpp's acceptance line when drafting, and
    `exactness` (`Exactness.line`: bitwise or up to the kernels' rounding) when given."""
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
    lines += block_lines(stats)
    shape = (f"tree {stats.tree_rows} rows (drafted from block {stats.block_size})" if stats.tree_rows
             else f"block {block_label(stats)}")
    per_row = f", {stats.tau_per_verify_row:.2f} tokens per verify row" if stats.verify_rows else ""
    lines.append(f"[{stats.mode}, {shape}, {stats.target_passes} target passes{per_row}, backend {stats.backend}]")
    if stats.ranks > 1:
        spent = (f", {1e3 * stats.collective_s_per_pass:.2f} ms in them per pass"
                 if stats.collective_s_per_pass is not None else "")
        lines.append(f"[target split over {stats.ranks} ranks: {stats.collectives_per_pass:g} collectives per pass{spent}]")
        if stats.split_parity:
            lines.append(f"[ranks: {stats.split_parity}]")
    if exactness:
        lines.append(f"[exactness: {exactness}]")
    return lines


def block_label(stats) -> str:
    return f"auto ≤ {stats.block_size}" if stats.block_policy == "auto" else str(stats.block_size)


def block_lines(stats) -> list[str]:
    """With --block-size auto: the block sizes used, the share decoded plainly, and any fallback."""
    if stats.block_policy != "auto" or stats.block_sizes is None:
        return []
    used = ", ".join(f"{'plain' if B == 1 else B}×{n}" for B, n in sorted(stats.block_sizes.items()))
    lines = [f"block sizes used = ({used or 'none'}), decoded plainly = {100 * (stats.plain_share or 0):.0f} % of tokens"]
    if stats.fallback:
        lines.append(f"auto fell back to plain decoding {stats.fallback}")
    return lines


def print_closing(stats: GenerationStats, exactness: str | None = None) -> None:
    sys.stdout.write("\n==========\n")
    for line in closing_lines(stats, exactness):
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
