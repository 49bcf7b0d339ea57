"""The closing reports: compare's table and parity line, bench's table and
verdict, doctor's sections and summary. Each is a pure function of the record
(or sections) the command built."""

from __future__ import annotations

from dflash2_mlx.text.modes import mode_name, short_mode_name

from .style import MUTED, STATUS_MARK, gb, machine_line, positions_text


# -- compare ----------------------------------------------------------------------------


def parity_text(parity):
    from rich.text import Text

    style = {"identical": "bold green", "diverged": "bold red", "distribution": "bold yellow"}[parity.verdict]
    return Text.assemble(("parity: ", "bold"), (parity.message, style))


def compare_table(comparison):
    """The closing table: speeds, speedup, τ, acceptance, passes, memory, machine."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from dflash2_mlx.tools.compare import honest_lines

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
    table.add_row("acceptance by position", "-", positions_text(s["acceptance_by_position"]))
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
        Text(machine_line(m), style=MUTED),
        parity_text(comparison.parity),
    ]
    if comparison.exactness_line:
        lines.append(Text.assemble(("exactness: ", "bold"), (comparison.exactness_line, MUTED)))
    for i, line in enumerate(honest_lines(s, m)):
        lines.insert(2 + i, Text(line, style="yellow"))
    return Group(*lines)


# -- bench ------------------------------------------------------------------------------


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
                      positions_text(r["acceptance_by_position"], 3), gb(r["peak_memory_gb"]), same)
    return table


def bench_report(record: dict):
    from rich.console import Group
    from rich.text import Text

    parts = [bench_table(record)]
    cost = record["verify_cost_ms"]
    if cost.get("1"):
        parts.append(Text("target forward cost by rows, relative to one row (measured): " + ", ".join(
            f"{B} rows {ms / cost['1']:.1f}x" for B, ms in cost.items() if B != "1"), style=MUTED))
    parts.append(Text(machine_line(record["machine"]), style=MUTED))
    for line in record["verdict"]:
        parts.append(Text("• " + line, style="yellow" if ("slower" in line or "near zero" in line) else None))
    for line in record["skipped"]:
        parts.append(Text(f"skipped: {line}", style=MUTED))
    return Group(*parts)


# -- doctor -----------------------------------------------------------------------------


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
