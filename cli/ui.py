"""All Rich code lives here; everything else hands it plain data.

Longer than most modules on purpose: keeping every renderer of every command in
one place (as mlx-lm's cli_ui does) keeps Rich out of the library and the
commands thin. Sections: generate/train, shared helpers, chat, compare, bench,
doctor. Each renderer is a pure function of its data."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rich.console import Console

from dflash2_mlx.text.modes import mode_name, short_mode_name

from .closing import (  # noqa: F401  (re-exported)
    block_label, block_lines, builtin_notice, closing_lines, print_closing, stream_text,
)
from .closing import note as status  # muted stderr notes: one implementation, no Rich needed

if TYPE_CHECKING:  # the library loads MLX: not needed to draw
    from dflash2_mlx.text.stats import GenerationStats

err_console = Console(stderr=True, highlight=False)


def progress_note(message: str) -> None:
    """A status line for people watching (a terminal), not for logs or pipes."""
    if err_console.is_terminal:
        status(message)


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


# == shared ===============================================================================
#
# Everything below is a pure function of the data it is given (returning a Rich
# renderable or text), plus thin printers; tests render them with
# `make_console(record=True)` and read the text back.

DRAFT_STYLE = "cyan"  # tokens drafted by the drafter and accepted by the target
MUTED = "grey50"
STATUS_MARK = {"ok": ("✓", "green"), "info": ("·", MUTED), "warn": ("!", "yellow"), "fail": ("✗", "bold red")}

console = Console(highlight=False)


def make_console(file=None, width: int = 100, record: bool = False, color: bool = False) -> Console:
    """A console for tests and captures: fixed width, no terminal needed."""
    import io

    return Console(file=file or io.StringIO(), width=width, record=record, highlight=False,
                   force_terminal=color, color_system="truecolor" if color else None)


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


def gb(x: float) -> str:
    """Memory the way people read it: GB, or MB below 0.1 GB (tiny test models)."""
    return f"{x:.2f} GB" if x >= 0.1 else f"{x * 1e3:.1f} MB"


def _positions(by_position: list[float], limit: int = 8) -> str:
    if not by_position:
        return "-"
    shown = " ".join(f"{p:.2f}" for p in by_position[:limit])
    return shown + (" …" if len(by_position) > limit else "")


# == chat =================================================================================

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
             f"prompt {last.prompt_tps:.1f} tok/s ({result.prefilled_tokens} new, {result.reused_tokens} cached)"]
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
    head = Text(
        f"  {mode_name(s.mode)}, block {s.block_size}: draft acceptance {s.acceptance_rate:.2f} "
        f"({s.accepted} accepted / {s.drafted} drafted), mean acceptance length {s.mean_acceptance_length:.2f}, "
        f"{s.target_passes} target passes for {s.generation_tokens} tokens")
    return Group(head, acceptance_bars(s.acceptance_by_position))


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


# == compare ==============================================================================


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
            label += f" (tree {run.stats.tree_rows})" if run.stats.tree_rows else f" (block {run.stats.block_size})"
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


def parity_text(parity):
    from rich.text import Text

    style = {"identical": "bold green", "diverged": "bold red", "distribution": "bold yellow"}[parity.verdict]
    return Text.assemble(("parity: ", "bold"), (parity.message, style))


def compare_table(comparison):
    """The closing table: speeds, speedup, τ, acceptance, passes, memory, machine."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    s = comparison.summary()
    a, d = s["ar"], s["spec"]
    auto = s.get("block_policy") == "auto"
    shape = f"tree {s['tree_rows']}" if s.get("tree_rows") else f"block {'auto ≤ ' if auto else ''}{s['block_size']}"
    spec_label = f"{mode_name(s['spec_mode'])} ({shape})"
    table = Table(title=f"median of {s['repeats']} repeat(s), order alternated, both arms warmed up", title_style=MUTED)
    table.add_column("")
    table.add_column("autoregressive", justify="right")
    table.add_column(spec_label, justify="right")
    table.add_row("decode tok/s (after prefill)", f"{a['decode_tps']:.1f}", f"{d['decode_tps']:.1f}")
    table.add_row("end-to-end tok/s", f"{a['e2e_tps']:.1f}", f"{d['e2e_tps']:.1f}")
    table.add_row("prompt tok/s", f"{a['prompt_tps']:.1f}", f"{d['prompt_tps']:.1f}")
    table.add_row("tokens", str(a["tokens"]), str(d["tokens"]))
    table.add_row("time to first token", f"{a['prompt_s']:.3f} s", f"{d['prompt_s']:.3f} s")
    table.add_row("total time", f"{a['total_s']:.3f} s", f"{d['total_s']:.3f} s")
    table.add_row("target passes after prefill", str(a["target_passes"]), str(d["target_passes"]))
    table.add_row("τ (tokens per target pass)", "1.00", f"{s['mean_acceptance_length']:.2f}")
    table.add_row("acceptance by position", "-", _positions(s["acceptance_by_position"]))
    if auto:
        used = ", ".join(f"{'plain' if B == 1 else B}×{n}" for B, n in sorted((s["block_sizes"] or {}).items()))
        table.add_row("block sizes used (last run)", "-", used or "-")
        table.add_row("decoded plainly", "100 %", f"{100 * s['plain_share']:.0f} %")
    table.add_row("peak memory", gb(a["peak_memory_gb"]), gb(d["peak_memory_gb"]))
    m = comparison.machine
    speed = s["speedup_decode"]
    verdict_style = "bold green" if speed >= 1 else "bold red"
    lines = [
        table,
        Text.assemble(("speedup: ", "bold"), (f"{speed:.2f}x", verdict_style),
                      f" decode after prefill, {s['speedup_e2e']:.2f}x end to end"),
        Text(f"backend {m['backend']} · device {m.get('device_name') or m['device']} · mlx {m['mlx_version']}",
             style=MUTED),
        parity_text(comparison.parity),
    ]
    if auto and s.get("fallback"):
        lines.insert(2, Text(f"auto fell back to plain decoding {s['fallback']}", style="yellow"))
    if 0 < speed < 1:
        tau = s["mean_acceptance_length"]
        why = (f"slower here: each cycle committed τ = {tau:.2f} tokens but took about {tau / speed:.1f}x a plain "
               "decoding step (drafting plus a block verify); speculation pays only when τ exceeds that cost.")
        if m["backend"] == "cpu":
            why += (" On the Linux CPU build a block verify of a real-size model costs nearly as much per row as "
                    "plain decoding, so it cannot win there; τ and target passes carry over to GPUs, tokens/s do not.")
        lines.insert(2, Text(why, style="yellow"))
    return Group(*lines)


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


# == bench ================================================================================


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




def bench_table(record: dict, suite: str = "all"):
    """One row per mode and block size; ★ marks each mode's best block size."""
    from rich.table import Table

    table = Table(title=f"dflash2 bench · {suite} prompts · medians of {record['settings']['repeats']} repeat(s)",
                  title_style=MUTED, padding=(0, 1))
    for name in ("mode", "B", "decode tok/s", "e2e tok/s", "speedup", "τ", "accept@pos", "peak", "=AR"):
        table.add_column(name, justify="left" if name in ("mode", "accept@pos") else "right", no_wrap=True)
    best = record.get("best_block_size", {})
    for r in record["summary"]:
        if r["suite"] != suite:
            continue
        speed = r["speedup_decode"]
        speed_text = "-" if speed is None or r["mode"] == "ar" else f"[{'green' if speed >= 1 else 'red'}]{speed:.2f}x[/]"
        star = "★" if best.get(r["mode"]) == r["block_size"] else ""
        same = "-" if r["identical_to_ar"] is None else f"{100 * r['identical_to_ar']:.0f}%"
        table.add_row(short_mode_name(r["mode"]) + star, str(r["block_size"]), f"{r['decode_tps']:.1f}",
                      f"{r['e2e_tps']:.1f}", speed_text, f"{r['mean_acceptance_length']:.2f}",
                      _positions(r["acceptance_by_position"], 3), gb(r["peak_memory_gb"]), same)
    return table


def bench_report(record: dict):
    from rich.console import Group
    from rich.text import Text

    m = record["machine"]
    parts = [bench_table(record)]
    cost = record["verify_cost_ms"]
    if cost.get("1"):
        parts.append(Text("target forward cost by rows, relative to one row (measured): " + ", ".join(
            f"{B} rows {ms / cost['1']:.1f}x" for B, ms in cost.items() if B != "1"), style=MUTED))
    parts.append(Text(f"backend {m['backend']} · device {m.get('device_name') or m['device']} · mlx {m['mlx_version']}",
                      style=MUTED))
    for line in record["verdict"]:
        parts.append(Text("• " + line, style="yellow" if ("slower" in line or "near zero" in line) else None))
    for line in record["skipped"]:
        parts.append(Text(f"skipped: {line}", style=MUTED))
    return Group(*parts)


# == doctor ===============================================================================


def doctor_section(section):
    from rich.table import Table

    table = Table(title=section.title, title_justify="left", title_style="bold", show_header=False,
                  box=None, padding=(0, 1))
    table.add_column(width=1)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for f in section.findings:
        mark, style = STATUS_MARK[f.status]
        table.add_row(f"[{style}]{mark}[/]", f.name, f.message)
    return table


def doctor_summary(problems: list[str]):
    from rich.text import Text

    if not problems:
        return Text("✓ all checks passed", style="bold green")
    return Text(f"✗ {len(problems)} problem(s) found", style="bold red")
