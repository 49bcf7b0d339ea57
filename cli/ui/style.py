"""The consoles, colours and small formatters every Rich view shares.

Everything the views draw is a pure function of plain data; tests render it
with `make_console(record=True)` and read the text back.
"""

from __future__ import annotations

from rich.console import Console

from ..closing import note as status  # muted stderr notes: one implementation, no Rich needed

DRAFT_STYLE = "cyan"  # tokens drafted by the drafter and accepted by the target
MUTED = "grey50"
STATUS_MARK = {"ok": ("✓", "green"), "info": ("·", MUTED), "warn": ("!", "yellow"), "fail": ("✗", "bold red")}

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def make_console(file=None, width: int = 100, record: bool = False, color: bool = False) -> Console:
    """A console for tests and captures: fixed width, no terminal needed."""
    import io

    return Console(file=file or io.StringIO(), width=width, record=record, highlight=False,
                   force_terminal=color, color_system="truecolor" if color else None)


def print_whole(renderable, out: Console = None) -> None:
    """Print `renderable` on `out` (stdout) without cutting it: on a terminal at
    the terminal's width; into a file or a pipe, where Rich would assume 80
    columns and cut table cells to "…", as wide as its widest line."""
    out = out or console
    if out.is_terminal:
        out.print(renderable)
        return
    from rich.measure import Measurement

    needed = Measurement.get(out, out.options.update_width(100_000), renderable).maximum
    width = out.width
    out.width = max(width, needed)  # print(width=...) cannot go past the console's own width
    try:
        out.print(renderable)
    finally:
        out.width = width


def progress_note(message: str) -> None:
    """A status line for people watching (a terminal), not for logs or pipes."""
    if err_console.is_terminal:
        status(message)


def gb(x: float) -> str:
    """Memory the way people read it: GB, or MB below 0.1 GB (tiny test models)."""
    return f"{x:.2f} GB" if x >= 0.1 else f"{x * 1e3:.1f} MB"


def positions_text(by_position: list[float], limit: int = 8) -> str:
    """Acceptance by draft position, the first `limit` of them, for a table cell."""
    if not by_position:
        return "-"
    shown = " ".join(f"{p:.2f}" for p in by_position[:limit])
    return shown + (" …" if len(by_position) > limit else "")


def machine_line(m: dict) -> str:
    """The backend, device and MLX version a result was measured on."""
    return f"backend {m['backend']} · device {m.get('device_name') or m['device']} · mlx {m['mlx_version']}"
