"""`dflash2 bench`: every mode (plain, DFlash, DFlash 2, mlx-lm's speculative
decoding with a tiny autoregressive draft) over a block-size sweep, the JSON
record and markdown table it writes, the verdict's wording, and one-line errors."""

import json
import subprocess

import pytest

from dflash2_mlx.tools.bench import BenchRun, markdown, summarize, verdict
from dflash2_mlx.tools.suites import SUITES, builtin_prompts, read_prompts
from dflash2_mlx.tools.synthetic import write_target
from helpers import drafter_folder, target_folder

RUN_KEYS = {"suite", "prompt_index", "mode", "block_size", "repeat", "prompt_tokens", "generation_tokens",
            "prompt_tps", "decode_tps", "e2e_tps", "mean_acceptance_length", "target_passes",
            "acceptance_by_position", "peak_memory_gb", "identical_to_ar", "token_ids"}
ROW_KEYS = {"mode", "block_size", "suite", "prompts", "decode_tps", "e2e_tps", "speedup_decode", "speedup_e2e",
            "mean_acceptance_length", "target_passes_per_token", "acceptance_by_position", "peak_memory_gb",
            "identical_to_ar"}


@pytest.fixture(scope="module")
def ar_draft(tmp_path_factory):
    """A tiny autoregressive draft model with the target's tokenizer, for mlx-lm's speculative decoding."""
    return write_target(tmp_path_factory.mktemp("ardraft") / "draft", "qwen3", seed=1, hidden_size=32,
                        num_hidden_layers=2)


def base_argv(*extra):
    return ["bench", "--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2"), *extra]


def test_all_modes_and_a_block_size_sweep(cli, ar_draft, tmp_path):
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    code, out, err = cli(base_argv(
        "--dflash-drafter", drafter_folder("qwen3", "dflash"), "--ar-draft-model", ar_draft,
        "--block-sizes", "2,4", "--repeats", 1, "--max-prompts", 1, "-m", 12,
        "--json", out_json, "--markdown", out_md))
    assert code == 0, err
    # Off a terminal (a log, a pipe) progress is plain lines: the first run and the last at least.
    assert "bench [0/24] code #0" in err and "bench [24/24] done" in err, err
    record = json.loads(out_json.read_text())
    assert record["kind"] == "dflash2-bench" and record["machine"]["backend"] == "cpu"
    assert record["command"].startswith("dflash2 bench --model ") and "commit" in record  # as typed
    assert [(p["suite"], p["index"]) for p in record["prompts"]] == [("code", 0), ("chat", 0), ("maths", 0)]
    configs = {(r["mode"], r["block_size"]) for r in record["runs"]}
    assert configs == {("ar", 1), ("mlx-lm", 1)} | {(m, B) for m in ("dflash", "dflash2", "mlx-lm-spec") for B in (2, 4)}
    assert len(record["runs"]) == 3 * 8
    for r in record["runs"]:
        assert RUN_KEYS <= set(r)
        assert r["generation_tokens"] == len(r["token_ids"]) <= 12 and r["decode_tps"] > 0
        if r["mode"] in ("dflash", "dflash2"):
            assert r["identical_to_ar"] is True  # greedy speculation is lossless
            assert len(r["acceptance_by_position"]) == r["block_size"] - 1
        if r["mode"] == "mlx-lm":  # mlx-lm's plain stream_generate beside ours
            assert r["identical_to_ar"] is True and r["mean_acceptance_length"] == 1
        if r["mode"] == "mlx-lm-spec":
            assert r["identical_to_ar"] is True and r["mean_acceptance_length"] >= 1  # lossless at T=0 too
    rows = record["summary"]
    assert all(ROW_KEYS <= set(r) for r in rows)
    overall = {(r["mode"], r["block_size"]) for r in rows if r["suite"] == "all"}
    assert overall == configs
    # Plain decoding is the reference (not compared with itself); every other row matched it on every prompt.
    assert all((r["identical_to_ar"] is None) if r["mode"] == "ar" else (r["identical_to_ar"] == 1.0) for r in rows)
    assert {r["suite"] for r in rows} == {"all", "code", "chat", "maths"}
    ar_row = next(r for r in rows if r["mode"] == "ar" and r["suite"] == "all")
    assert ar_row["speedup_decode"] == pytest.approx(1.0)
    assert set(record["verify_cost_ms"]) == {"1", "2", "4"}
    assert set(record["best_block_size"]) == {"dflash", "dflash2", "mlx-lm-spec"}
    assert all(B in (2, 4) for B in record["best_block_size"].values())
    text = " ".join(record["verdict"])
    for mode in ("DFlash", "DFlash 2", "mlx-lm speculative"):
        assert f"{mode} is slower than plain decoding" in text or f"{mode}: best block size" in text
    assert "Backend cpu" in text and "16-row forward costs about 10x" in text
    md = out_md.read_text()
    assert md.startswith("# dflash2 bench")
    assert f"Command: `{record['command']}` at commit {record['commit'] or 'unknown'}." in md
    assert "| mode | block | decode tok/s | end-to-end tok/s | speedup (decode) |" in md
    for label in ("| autoregressive | 1 |", "| DFlash | 2 |", "| DFlash 2 | 4 |", "| mlx-lm speculative | 4 |"):
        assert label in md, label
    assert "| mode | block | chat | code | maths |" in md and "Target forward cost by rows" in md
    assert all(f"- {line}" in md for line in record["verdict"])
    assert "dflash2 bench" in out and "DFlash 2" in out and "★" in out  # the terminal table


def test_auto_block_size_row(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out_json = tmp_path / "bench.json"
    code, out, err = cli(base_argv("--block-sizes", "auto,3", "--suite", "code", "--max-prompts", 1,
                                   "--repeats", 1, "-m", 12, "--json", out_json))
    assert code == 0, err
    record = json.loads(out_json.read_text())
    auto = [r for r in record["runs"] if r["block_size"] == "auto"]
    assert len(auto) == 1 and auto[0]["mode"] == "dflash2" and auto[0]["identical_to_ar"] is True
    assert 0 <= auto[0]["plain_share"] <= 1 and sum(auto[0]["block_sizes"].values()) >= 1
    assert "dflash2" in record["calibration"] and list((tmp_path / "cache" / "dflash2-mlx").glob("calibration-*.json"))
    assert any("with --block-size auto" in line for line in record["verdict"])


def test_prompts_file_and_json_to_stdout(cli, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "suite": "code"}\n\n{"prompt": "Hello!"}\n')
    code, out, err = cli(base_argv("--prompts", prompts, "--block-sizes", "3", "--repeats", 2, "-m", 6,
                                   "--json", "-"))
    assert code == 0, err
    record = json.loads(out)
    assert [(p["suite"], p["text"]) for p in record["prompts"]] == [("code", "def add(a, b):"), ("mine", "Hello!")]
    # prompts × repeats × (plain, mlx-lm plain, DFlash 2 block 3)
    assert {r["repeat"] for r in record["runs"]} == {0, 1} and len(record["runs"]) == 2 * 2 * 3


def test_sampled_runs_have_no_parity_verdict(cli):
    """At T > 0 the token ids are draws, so no run is compared with plain decoding."""
    code, out, err = cli(base_argv("--block-sizes", "3", "--suite", "code", "--max-prompts", 1, "--repeats", 1,
                                   "-m", 6, "--temp", 1, "--seed", 3, "--json", "-"))
    assert code == 0, err
    record = json.loads(out)
    assert {r["mode"] for r in record["runs"]} == {"ar", "mlx-lm", "dflash2"}
    assert all(r["identical_to_ar"] is None for r in record["runs"] + record["summary"])


def test_a_diverged_prompt_is_counted_not_hidden():
    """Greedy runs whose tokens differ from plain decoding (near-ties on Metal) are
    kept as False: the row reports the share of prompts that matched."""
    same, diverged = run("dflash2", 4, 250.0, 3.0), run("dflash2", 4, 75.0, 2.0, index=1)
    runs = [run("ar", 1, 100.0), run("ar", 1, 50.0, index=1),
            BenchRun(**{**same.__dict__, "identical_to_ar": True}),
            BenchRun(**{**diverged.__dict__, "identical_to_ar": False})]
    rows = {(r["mode"], r["block_size"], r["suite"]): r for r in summarize(runs)}
    assert rows[("dflash2", 4, "all")]["identical_to_ar"] == 0.5
    assert rows[("ar", 1, "all")]["identical_to_ar"] is None
    record = {"machine": {"backend": "cpu", "device": "x86_64", "mlx_version": "0"},
              "settings": {"max_tokens": 8, "temperature": 0.0, "repeats": 1}, "prompts": [{}, {}],
              "summary": summarize(runs), "verify_cost_ms": {}, "verdict": [], "skipped": []}
    assert "| 50 % |" in markdown(record)


def test_results_carry_their_command_and_commit(tmp_path):
    from dflash2_mlx.tools.provenance import CHECKOUT, command_line, git_commit, provenance

    assert git_commit(tmp_path) is None  # not a git checkout
    assert command_line("dflash2", ["bench", "--prompts", "my prompts.txt"]) == "dflash2 bench --prompts 'my prompts.txt'"
    record = provenance("dflash2 bench -m 4")
    assert record["command"] == "dflash2 bench -m 4"
    if (CHECKOUT / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True)
        assert record["commit"] == head.stdout.strip()


def test_suites_and_prompt_files(tmp_path):
    assert set(SUITES) == {"code", "chat", "maths"} and all(len(v) >= 3 for v in SUITES.values())
    assert [p.suite for p in builtin_prompts(["maths", "code"], limit=2)] == ["maths", "maths", "code", "code"]
    plain = tmp_path / "p.txt"
    plain.write_text("one\n\n two \nthree\n")
    assert [p.text for p in read_prompts(plain, limit=2)] == ["one", " two "]


def run(mode, B, decode, tau=1.0, suite="code", index=0):
    return BenchRun(suite, index, mode, B, 0, 10, 20, 100.0, decode, decode * 0.9, tau, 10, [0.5] * (B - 1),
                    0.1, None, [])


def test_summary_speedups_are_per_prompt_ratios():
    runs = [run("ar", 1, 100.0), run("dflash2", 4, 250.0, 3.0),
            run("ar", 1, 50.0, index=1), run("dflash2", 4, 75.0, 2.0, index=1)]
    rows = {(r["mode"], r["block_size"], r["suite"]): r for r in summarize(runs)}
    row = rows[("dflash2", 4, "all")]
    assert row["speedup_decode"] == pytest.approx((2.5 + 1.5) / 2)
    assert row["mean_acceptance_length"] == pytest.approx(2.5) and row["prompts"] == 2


def test_verdict_says_why_speculation_loses():
    summary = summarize([run("ar", 1, 100.0), run("dflash2", 4, 40.0, 1.1), run("dflash2", 8, 30.0, 1.1)])
    best, lines = verdict(summary, {1: 1.0, 4: 3.6, 8: 7.0}, "cpu")
    assert best == {"dflash2": 4}
    assert lines[0].startswith("DFlash 2 is slower than plain decoding here at every block size tried (best: block 4")
    assert "tau = 1.10" in lines[0] and "the 4-row verify alone 3.6x" in lines[0] and "about 2.8x" in lines[0]
    assert any("acceptance is near zero" in line for line in lines)
    assert "8-row target forward costs 7.0x" in lines[-1]
    best, lines = verdict(summarize([run("ar", 1, 100.0), run("dflash2", 4, 180.0, 3.2)]), {1: 1.0, 4: 1.1}, "metal")
    assert lines == ["DFlash 2: best block size on this machine is 4 (1.80x plain decoding after prefill, "
                     "tau 3.20 tokens per target pass)."]


def test_verdict_gives_no_verify_cost_it_did_not_measure():
    """--block-size auto has no single B-row verify (and a size may be missing from
    the costs): the verdict says so instead of a made-up 0.0x."""
    auto = BenchRun("code", 0, "dflash2", "auto", 0, 10, 20, 100.0, 97.0, 87.3, 1.01, 19, [0.1] * 15, 0.1, None, [],
                    plain_share=0.9, block_sizes={1: 17, 16: 2})
    summary = summarize([run("ar", 1, 100.0), auto, run("dflash2", 4, 40.0, 1.1)])
    best, lines = verdict(summary, {1: 1.0, 4: 3.6}, "cpu")
    slower = next(line for line in lines if line.startswith("DFlash 2 is slower"))
    assert best == {"dflash2": "auto"} and "(best: block auto at 0.97x)" in slower
    assert "verify alone" not in slower and "0.0x" not in slower and "no one verify cost applies" in slower
    _, lines = verdict(summarize([run("ar", 1, 100.0), run("dflash2", 4, 40.0, 1.1)]), {1: 1.0}, "cpu")
    assert "verify alone" not in lines[0] and "(the verify cost was not measured)" in lines[0]


def test_markdown_from_a_record():
    summary = summarize([run("ar", 1, 100.0), run("dflash2", 4, 40.0, 1.1)])
    best, lines = verdict(summary, {1: 1.0, 4: 3.6}, "cpu")
    record = {"machine": {"backend": "cpu", "device": "x86_64", "mlx_version": "0"},
              "settings": {"max_tokens": 8, "temperature": 0.0, "repeats": 1}, "prompts": [{}],
              "summary": summary, "verify_cost_ms": {"1": 1.0, "4": 3.6}, "verdict": lines, "skipped": []}
    md = markdown(record)
    assert "| DFlash 2 | 4 | 40.0 | 36.0 | 0.40x | 0.40x | 1.10 | 0.50, 0.50, 0.50 |" in md
    assert "4 rows 3.6x" in md


def test_help(cli):
    code, out, _ = cli(["bench", "--help"])
    assert code == 0 and "says" in out and "plainly" in out
    for flag in ("--model", "--drafter", "--dflash-drafter", "--ar-draft-model", "--suite", "--prompts",
                 "--max-prompts", "--block-sizes", "--repeats", "--json", "--markdown", "--temp", "--seed"):
        assert flag in out, flag


@pytest.mark.parametrize("extra, code, fragment", [
    (["--bogus"], 2, "--bogus"),
    (["--repeats", "x"], 2, "repeats"),
    (["--block-sizes", "2,x"], 1, "--block-sizes"),
    (["--block-sizes", "1,4"], 1, "2 or more"),
    (["--suite", "poetry"], 1, "unknown suite 'poetry'"),
    (["--prompts", "/nonexistent/prompts.txt"], 1, "does not exist"),
    (["--model", "/nonexistent/target"], 1, "does not exist"),
])
def test_bad_input_is_one_line_error(cli, extra, code, fragment):
    got, out, err = cli(base_argv(*extra))
    assert got == code, err
    assert out == "" and err.count("\n") == err.count("error: ") and fragment in err.splitlines()[-1]
    assert "Traceback" not in err


def test_dflash_drafter_as_draft_model_is_refused(cli):
    got, out, err = cli(base_argv("--ar-draft-model", drafter_folder("qwen3", "dflash")))
    assert got == 1 and "is a DFlash drafter: pass it as --drafter" in err and "Traceback" not in err
