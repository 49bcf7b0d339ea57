"""`--plot` on bench, analyze and compare: PNG and SVG files, labelled, with the
plotted numbers in a JSON beside each that equal the run's own JSON record; and
one clear line, before any work, when matplotlib is missing."""

import json
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import drafter_folder, target_folder

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DATA = [str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "scanner.py")]  # one small file: a quick analyze


def pair_args():
    return ["--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2")]


def check_files(stem, title: str) -> dict:
    """STEM.png and STEM.svg are real, non-empty images labelled with the machine and
    the command; returns STEM.json, the data they plot."""
    png, svg = stem.with_suffix(".png").read_bytes(), stem.with_suffix(".svg").read_text()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    root = ET.fromstring(svg)  # well-formed SVG
    assert root.tag.endswith("svg")
    texts = " ".join(svg.split())
    for fragment in (title, "backend cpu", "dflash2 "):  # text stays text in the SVG (svg.fonttype none)
        assert fragment in texts, fragment
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["title"] == title and data["label"].startswith("backend cpu")
    return data


def test_compare_plot_is_the_records_timeline(cli, tmp_path):
    saved, plot = tmp_path / "race.json", tmp_path / "plots" / "race.png"
    code, _, err = cli(["compare", *pair_args(), "-p", "Write a loop", "-m", 12, "--block-size", 4, "--repeats", 1,
                        "--no-live", "--save", saved, "--plot", plot])
    assert code == 0, err
    record = json.loads(saved.read_text())
    data = check_files(plot.with_suffix(""), "tokens against time, both arms")
    assert set(data["arms"]) == {"ar", "dflash2"}
    for mode, arm in data["arms"].items():
        run = record["runs"][mode][0]
        assert arm["times_s"] == run["times_s"] and arm["from_draft"] == run["from_draft"]
        assert arm["tokens"] == list(range(1, len(run["token_ids"]) + 1))
    assert data["speedup_decode"] == record["summary"]["speedup_decode"]
    assert data["parity"] == record["parity"]["verdict"] == "identical"


def test_bench_plots_are_the_records_summary(cli, tmp_path):
    out, folder = tmp_path / "bench.json", tmp_path / "plots"
    code, _, err = cli(["bench", *pair_args(), "--suite", "code", "--max-prompts", 1, "-m", 12, "--repeats", 1,
                        "--block-sizes", "2,4", "--json", out, "--plot", folder])
    assert code == 0, err
    rows = [r for r in json.loads(out.read_text())["summary"] if r["suite"] == "all"]
    speed = check_files(folder / "decode_tps", "decode tokens/s by mode and block size")
    assert speed["baselines"] == {r["mode"]: r["decode_tps"] for r in rows if r["block_size"] == 1}
    assert "ar" in speed["baselines"]
    [series] = speed["series"]
    assert series["mode"] == "dflash2" and series["block_size"] == ["2", "4"]
    assert series["decode_tps"] == [r["decode_tps"] for r in rows if r["mode"] == "dflash2"]
    accept = check_files(folder / "acceptance_by_position", "acceptance by draft position")
    assert [s["acceptance_by_position"] for s in accept["series"]] == \
        [r["acceptance_by_position"] for r in rows if r["mode"] == "dflash2"]
    assert [len(s["acceptance_by_position"]) for s in accept["series"]] == [1, 3]


def test_analyze_plots_are_the_records_recall(cli, tmp_path):
    out, folder = tmp_path / "report", tmp_path / "plots"
    code, _, err = cli(["analyze", "--model", target_folder("qwen3"), "--dflash2", drafter_folder("qwen3", "dflash2"),
                        "--data", DATA[0], "--heldout-fraction", "1.0", "--out", out, "--prompts", 1,
                        "--max-tokens", 4, "--seq-len", 48, "--prompt-len", 16, "--plot", folder])
    assert code == 0, err
    tf = json.loads((out / "analysis.json").read_text())["variants"]["dflash2"]["teacher_forced"]
    figure = check_files(folder / "figure2_recall1_by_position", "Recall@1 by draft position (the seed's Figure 2)")
    assert figure["series"] == [{"variant": "dflash2", "recall1_by_position": tf["recall1_by_position"]}]
    table = check_files(folder / "table1_recall", "Recall@1 and Recall@K by position (the seed's Table 1; "
                        "K = the drafter's selector top-K)")
    [row] = table["rows"]
    assert (row["recall1_by_position"], row["recallK_by_position"], row["tau_oracle"]) == \
        (tf["recall1_by_position"], tf["recallK_by_position"], tf["tau_oracle"])


@pytest.mark.parametrize("command", ["compare", "bench", "analyze"])
def test_missing_matplotlib_is_one_line_before_any_work(cli, tmp_path, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    argv = {"compare": ["compare", *pair_args(), "--plot", tmp_path / "p.png"],
            "bench": ["bench", *pair_args(), "--plot", tmp_path / "plots"],
            "analyze": ["analyze", "--model", target_folder("qwen3"), "--dflash2", drafter_folder("qwen3", "dflash2"),
                        "--data", DATA[0], "--out", tmp_path / "report", "--plot", tmp_path / "plots"]}[command]
    code, out, err = cli(argv)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "matplotlib is not installed" in lines[0] and "[plots]" in lines[0], err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # refused before loading or writing anything
