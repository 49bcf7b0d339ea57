"""`dflash2 compare`'s live view: the two arms side by side, replayed on one
timeline from their recorded token times (or drawn once, finished)."""

from __future__ import annotations

from rich.console import Console

from dflash2_mlx.text.modes import mode_name

from ..closing import block_label
from .style import DRAFT_STYLE, MUTED, console


def _tail(text, width: int, height: int):
    """The last `height` lines of `text` wrapped at `width` (the pane follows the end)."""
    from rich.text import Text

    lines = text.wrap(Console(width=width), width)
    return Text("\n").join(list(lines)[-height:]) if len(lines) > height else text


def _run_text(run, shown: int, color: bool = True):
    from rich.text import Text

    text = Text()
    for piece, drafted in zip(run.pieces[:shown], run.from_draft[:shown]):
        text.append(piece, style=DRAFT_STYLE if color and drafted else None)
    return text


def compare_panes(comparison, frame, width: int = 160, height: int = 14, speed: float = 1.0, replayed: bool = True):
    """The two arms side by side at replay time `frame.t` (a pure function of it).
    `replayed=False`: the finished runs drawn once (--no-live), not a replay."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    ar, spec = comparison.ar[0], comparison.spec[0]
    inner = max(width // 2 - 4, 10)
    grid = Table.grid(expand=True, padding=(0, 0))
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    panes = []
    for run, shown, done in ((ar, frame.ar_shown, frame.ar_done), (spec, frame.spec_shown, frame.spec_done)):
        t = min(frame.t, run.total_seconds)
        rate = (shown - 1) / (t - run.prompt_seconds) if shown > 1 and t > run.prompt_seconds else 0.0
        label = mode_name(run.mode)
        if run.mode != "ar":
            label += f" (tree {run.stats.tree_rows})" if run.stats.tree_rows else f" (block {block_label(run.stats)})"
        sub = f"{shown} tok · {t:.2f} s · {rate:.1f} tok/s"
        panes.append(Panel(_tail(_run_text(run, shown), inner, height - 2), title=f"[bold]{label}[/]",
                           subtitle=sub, height=height, border_style="green" if done else "blue"))
    grid.add_row(*panes)
    ran = f"measured run 1 of {len(comparison.ar)}: the two arms ran one after the other (never at the same time)"
    when = (("REPLAY", "bold reverse"), f" of {ran} and are shown on one timeline at {speed:g}x their recorded "
            f"speed · t = {frame.t:.2f} s · ") if replayed else (ran[0].upper() + ran[1:] + " · ",)
    head = Text.assemble(*when, ("drafted tokens", DRAFT_STYLE),
                         " were proposed by the drafter and accepted by the target", style=MUTED)
    return Group(head, grid)


def final_panes(comparison, width: int = None, replayed: bool = True):
    """Both arms complete, as the replay ends (or, `replayed=False`, without one)."""
    from dflash2_mlx.tools.compare import replay_duration, replay_frame

    ar, spec = comparison.ar[0], comparison.spec[0]
    width = width or console.width
    inner = max(width // 2 - 4, 10)
    lines = max(len(_run_text(r, len(r.tokens)).wrap(Console(width=inner), inner)) for r in (ar, spec))
    frame = replay_frame(ar, spec, replay_duration(ar, spec))
    return compare_panes(comparison, frame, width, max(3, min(lines, 18)) + 2, replayed=replayed)


def replay(comparison, speed: float = 1.0, fps: int = 20, out: Console = None) -> None:
    """Replay both recorded runs on one timeline, redrawn `fps` times a second."""
    import time

    from rich.live import Live

    from dflash2_mlx.tools.compare import replay_duration, replay_frame

    out = out or console
    ar, spec = comparison.ar[0], comparison.spec[0]
    duration = replay_duration(ar, spec)
    height = max(8, min(20, out.height - 22))

    def render(t):
        return compare_panes(comparison, replay_frame(ar, spec, t), out.width, height, speed)

    with Live(render(0.0), console=out, auto_refresh=False, transient=False) as live:
        start = time.perf_counter()
        while True:
            t = (time.perf_counter() - start) * speed
            live.update(render(min(t, duration)), refresh=True)
            if t >= duration:
                break
            time.sleep(1 / fps)
