"""What `dflash2 chat` draws: the header, the command help, streamed answers
with drafted tokens coloured, the per-turn line and `/stats`."""

from __future__ import annotations

from rich.console import Console

from dflash2_mlx.text.modes import mode_name

from ..closing import block_label, block_lines
from .style import DRAFT_STYLE, MUTED, console, gb

CHAT_COMMANDS = [
    ("/help, /?", "show this help"),
    ("/reset, /clear", "forget the conversation"),
    ("/system TEXT", "set the system prompt (no TEXT: show it)"),
    ("/set NAME VALUE", "temp, top_p, top_k, min_p, max_tokens, block_size, tree (no NAME: show all)"),
    ("/stats", "last answer: acceptance by position"),
    ("/color", "colour drafted tokens on/off"),
    ('"""', "start or end a multi-line message"),
    ("/quit, /bye, q, Ctrl-D", "leave (Ctrl-C stops an answer; twice at the prompt leaves)"),
]


def header_panel(title: str, rows: list[tuple[str, str]]):
    """The boxed header mlx-lm's chat shows: aligned label / value rows."""
    from rich.box import ROUNDED
    from rich.panel import Panel
    from rich.text import Text

    width = max((len(k) for k, _ in rows), default=0)
    body = Text()
    for i, (k, v) in enumerate(rows):
        body.append(("\n" if i else "") + f"  {k.ljust(width)}   ")
        body.append(str(v), style="bold")
    return Panel(body, title=f"[bold magenta]{title}[/]", title_align="left", border_style="blue",
                 box=ROUNDED, padding=(0, 2))


def acceptance_bars(by_position: list[float], width: int = 20):
    """Acceptance rate per draft position as bars: P(accepted | all earlier accepted)."""
    from rich.table import Table

    table = Table.grid(padding=(0, 1))
    for i, p in enumerate(by_position, 1):
        filled = round(p * width)
        table.add_row(f"pos {i:>2}", f"[{DRAFT_STYLE}]{'█' * filled}[/][{MUTED}]{'░' * (width - filled)}[/]", f"{p:.2f}")
    return table


def chat_help():
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    for cmd, what in CHAT_COMMANDS:
        table.add_row(f"  [bold]{cmd}[/]", f"[{MUTED}]{what}[/]")
    return table


def turn_line(result) -> "Text":
    """mlx-lm's muted per-turn line, plus what was prefilled and τ."""
    from rich.text import Text

    last, stats = result.last, result.stats
    if last is None:
        return Text("  interrupted before the first token", style=MUTED)
    parts = [f"{last.generation_tokens} tokens", f"{last.generation_tps:.1f} tok/s",
             f"prompt {last.prompt_tps:.1f} tok/s ({result.prefilled_tokens} new, {result.reused_tokens} cached"
             + (f", {result.disk_tokens} from disk)" if result.disk_tokens else ")")]
    if stats is not None and stats.mode != "ar":
        parts.append(f"τ {stats.mean_acceptance_length:.2f}")
    parts.append(f"peak {gb(last.peak_memory)}")
    if result.interrupted:
        parts.append("interrupted")
    return Text("  " + " · ".join(parts), style=MUTED)


def turn_stats(result):
    """What `/stats` shows for the last answer."""
    from rich.console import Group
    from rich.text import Text

    if result is None:
        return Text("  no answer yet", style=MUTED)
    s = result.stats
    if s is None:
        return Text("  the last answer was interrupted: no statistics", style=MUTED)
    if s.mode == "ar":
        return Text(f"  plain decoding: {s.generation_tokens} tokens, {s.target_passes} target passes", style=MUTED)
    shape = f"tree {s.tree_rows}" if s.tree_rows else f"block {block_label(s)}"
    head = Text(
        f"  {mode_name(s.mode)}, {shape}: draft acceptance {s.acceptance_rate:.2f} "
        f"({s.accepted} accepted / {s.drafted} drafted), mean acceptance length {s.mean_acceptance_length:.2f}, "
        f"{s.target_passes} target passes for {s.generation_tokens} tokens")
    used = [Text(f"  {line}", style=MUTED) for line in block_lines(s)]  # what auto chose, as generate says it
    return Group(head, *used, acceptance_bars(s.acceptance_by_position))


class ChatView:
    """Prints the chat; `color` colours drafted tokens."""

    def __init__(self, out: Console = None, color: bool = True):
        self.console = out or console
        self.color = color

    def show(self, renderable) -> None:
        self.console.print(renderable)

    def header(self, rows: list[tuple[str, str]]) -> None:
        self.show(header_panel("dflash2 chat", rows))
        self.show(chat_help())

    def notice(self, text: str) -> None:
        self.console.print(f"  {text}", style=MUTED, markup=False)

    def error(self, text: str) -> None:
        self.console.print(f"  error: {text}", style="red", markup=False)

    def prompt(self, continuation: bool = False) -> str:
        """The input prompt; colour codes wrapped so readline measures it right."""
        text = "... " if continuation else ">>> "
        if not self.console.is_terminal:
            return text
        return f"\x01\x1b[1;35m\x02{text}\x01\x1b[0m\x02"

    def token(self, text: str, from_draft: bool) -> None:
        if text:
            self.console.print(text, style=DRAFT_STYLE if self.color and from_draft else None, end="",
                               markup=False, highlight=False, soft_wrap=True)

    def end_answer(self, result) -> None:
        self.console.print()
        self.show(turn_line(result))
        if result.note:
            self.notice(result.note)
