"""Plots of the bench, analyze and compare records (matplotlib, an optional extra).

Every plot is written as PNG and SVG, labelled with the machine, the backend and
the command that made the record, with a JSON file beside it holding exactly the
numbers drawn (so a plot can be checked against its record, or redrawn elsewhere).
matplotlib is imported only when a plot is drawn; `require()` lets a command refuse
in one line before its work when it is missing. The figures are built without
pyplot (no global state, no display needed). No UI here.
"""

import io
import json
from pathlib import Path
from typing import Optional

from ..errors import DFlashError
from ..files import atomic_write_bytes, atomic_write_text
from ..text.modes import MODE_LABELS


def _name(mode: str) -> str:
    """The mode as every report names it (text/modes.py); the key itself when unknown."""
    return MODE_LABELS[mode][0] if mode in MODE_LABELS else mode

MISSING = ("matplotlib is not installed, and --plot needs it: pip install 'dflash2-mlx[plots]' "
           "(or pip install 'matplotlib>=3.8')")
FORMATS = ("png", "svg")


def require() -> None:
    """Raise the one-line DFlashError when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DFlashError(MISSING) from None


def bench_plots(record: dict, folder) -> list[Path]:
    """Decode tok/s by mode and block size, and acceptance by draft position, over
    all prompts of a `dflash2 bench` record."""
    rows = [r for r in record["summary"] if r["suite"] == "all"]
    label = _label(_machine_text(record["machine"]), record.get("command"))
    # One-token-per-pass rows (plain decoding, mlx-lm's plain loop) are baselines, drawn as lines.
    baselines = {r["mode"]: r["decode_tps"] for r in rows if r["block_size"] == 1}
    drafted = [r for r in rows if r["block_size"] != 1]
    modes = list(dict.fromkeys(r["mode"] for r in drafted))
    sizes = list(dict.fromkeys(str(r["block_size"]) for r in drafted))
    speed = {"kind": "bench-decode-tps", "block_sizes": sizes, "baselines": baselines,
             "series": [{"mode": m, "block_size": [str(r["block_size"]) for r in drafted if r["mode"] == m],
                         "decode_tps": [r["decode_tps"] for r in drafted if r["mode"] == m]} for m in modes]}
    accept = {"kind": "bench-acceptance-by-position",
              "series": [{"mode": r["mode"], "block_size": str(r["block_size"]),
                          "acceptance_by_position": r["acceptance_by_position"]}
                         for r in drafted if r["acceptance_by_position"]]}

    def draw_speed(ax):
        width = 0.8 / max(len(modes), 1)
        for i, s in enumerate(speed["series"]):
            xs = [sizes.index(B) + (i - (len(modes) - 1) / 2) * width for B in s["block_size"]]
            ax.bar(xs, s["decode_tps"], width, label=_name(s["mode"]))
        for (mode, tps), style in zip(baselines.items(), ("--", ":", "-.")):
            ax.axhline(tps, color="black", linestyle=style, linewidth=1,
                       label=f"{_name(mode)} ({tps:.1f})")
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_xlabel("block size (auto: chosen per cycle)")
        ax.set_ylabel("decode tokens/s (after prefill, median over prompts)")
        ax.legend()

    def draw_accept(ax):
        for s in accept["series"]:
            p = s["acceptance_by_position"]
            ax.plot(range(1, len(p) + 1), [100 * x for x in p], marker="o",
                    label=f"{_name(s['mode'])}, block {s['block_size']}")
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted % (given the earlier ones were)")
        ax.set_ylim(0, 100)
        ax.legend()

    folder = Path(folder)
    return (_write(folder / "decode_tps", "decode tokens/s by mode and block size", label, speed, draw_speed)
            + _write(folder / "acceptance_by_position", "acceptance by draft position", label, accept, draw_accept))


def analyze_plots(record: dict, folder) -> list[Path]:
    """The seed's Figure 2 (Recall@1 by draft position for each variant) and Table 1
    (Recall@1 and Recall@K by position, oracle τ) from a `dflash2 analyze` record."""
    variants = record["variants"]
    first = next(iter(variants.values()))
    label = _label(_machine_text(first["cycle"]), record.get("command"))
    recall = {"kind": "analyze-recall1-by-position",
              "series": [{"variant": name, "recall1_by_position": v["teacher_forced"]["recall1_by_position"]}
                         for name, v in variants.items()]}
    table = {"kind": "analyze-recall-table",
             "rows": [{"variant": name, "recall1_by_position": v["teacher_forced"]["recall1_by_position"],
                       "recallK_by_position": v["teacher_forced"]["recallK_by_position"],
                       "tau_teacher_forced": v["teacher_forced"]["tau_teacher_forced"],
                       "tau_oracle": v["teacher_forced"]["tau_oracle"]} for name, v in variants.items()]}

    def draw_recall(ax):
        for s in recall["series"]:
            r = s["recall1_by_position"]
            ax.plot(range(len(r)), [100 * x for x in r], marker="o", label=s["variant"])
        ax.set_xlabel("draft position")
        ax.set_ylabel("Recall@1 % (teacher-forced)")
        ax.set_ylim(0, 100)
        ax.legend()

    def draw_table(ax):
        ax.axis("off")
        width = max(len(r["recall1_by_position"]) for r in table["rows"])
        cells, names = [], []
        for r in table["rows"]:
            for key, what, tau in (("recall1_by_position", "Recall@1", r["tau_teacher_forced"]),
                                   ("recallK_by_position", "Recall@K", r["tau_oracle"])):
                values = [f"{100 * x:.1f}" for x in r[key]] + [""] * (width - len(r[key]))
                cells.append(values + [f"{tau:.2f}" + (" (oracle)" if what == "Recall@K" else "")])
                names.append(f"{r['variant']} {what}")
        grid = ax.table(cellText=cells, rowLabels=names, colLabels=[str(i) for i in range(width)] + ["τ"],
                        loc="center")
        grid.auto_set_font_size(False)
        grid.set_fontsize(9)
        grid.auto_set_column_width(list(range(width + 1)))
        grid.scale(1, 1.3)

    folder = Path(folder)
    return (_write(folder / "figure2_recall1_by_position", "Recall@1 by draft position (the seed's Figure 2)",
                   label, recall, draw_recall)
            + _write(folder / "table1_recall", "Recall@1 and Recall@K by position (the seed's Table 1; "
                     "K = the drafter's selector top-K)", label, table, draw_table,
                     size=(11, 1.8 + 0.7 * len(table["rows"]))))


def compare_plot(record: dict, file) -> list[Path]:
    """Both arms' tokens against time (the first repeat of each) from a `dflash2 compare`
    record, or a race record of the page; `file`'s suffix is dropped, .png and .svg written."""
    label = _label(_machine_text(record["machine"]), record.get("command"))
    arms = {mode: runs[0] for mode, runs in record["runs"].items()}
    data = {"kind": "compare-tokens-vs-time",
            "arms": {mode: {"times_s": run["times_s"], "tokens": list(range(1, len(run["times_s"]) + 1)),
                            "from_draft": run["from_draft"]} for mode, run in arms.items()},
            "speedup_decode": record["summary"]["speedup_decode"], "parity": record["parity"]["verdict"]}

    def draw(ax):
        for mode, arm in data["arms"].items():
            ax.step(arm["times_s"], arm["tokens"], where="post", label=_name(mode))
        ax.set_xlabel("seconds from the call (the first token includes prefill)")
        ax.set_ylabel("tokens generated")
        ax.legend(title=f"decode speedup {data['speedup_decode']:.2f}x · parity {data['parity']}")

    path = Path(file)
    stem = path.with_suffix("") if path.suffix.lower() in (".png", ".svg", ".json") else path
    return _write(stem, "tokens against time, both arms", label, data, draw)


def _machine_text(m: dict) -> str:
    return (f"backend {m.get('backend')} · device {m.get('device_name') or m.get('device')} · "
            f"mlx {m.get('mlx_version')}")


def _label(machine: str, command: Optional[str]) -> str:
    return machine + (f"\n{command}" if command else "")


def _write(stem: Path, title: str, label: str, data: dict, draw, size=(8, 5)) -> list[Path]:
    """Draw one figure and write STEM.png, STEM.svg and STEM.json (each whole or not at all)."""
    require()
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    data = {**data, "title": title, "label": label}
    # A fixed hash salt and no date: the same record draws the same SVG.
    with rc_context({"svg.hashsalt": "dflash2", "svg.fonttype": "none"}):
        fig = Figure(figsize=size, layout="constrained")
        ax = fig.add_subplot()
        draw(ax)
        ax.set_title(title)
        fig.text(0.01, 0.005, _wrapped(label), fontsize=7, color="0.35", va="bottom", ha="left")
        bottom = (0.3 if size[1] < 4 else 0.09) if "\n" in label else 0.05  # room for the label under the axes
        fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))
        written = []
        for fmt in FORMATS:
            out = io.BytesIO()
            fig.savefig(out, format=fmt, dpi=120, metadata={"Date": None} if fmt == "svg" else None)
            written.append(atomic_write_bytes(stem.with_suffix(f".{fmt}"), out.getvalue()))
    written.append(atomic_write_text(stem.with_suffix(".json"), json.dumps(data, indent=2) + "\n"))
    return written


def _wrapped(label: str, width: int = 150) -> str:
    lines = []
    for line in label.splitlines():
        while len(line) > width:
            cut = line.rfind(" ", 0, width)
            cut = cut if cut > 0 else width
            lines.append(line[:cut])
            line = "    " + line[cut:].lstrip()
        lines.append(line)
    return "\n".join(lines)
