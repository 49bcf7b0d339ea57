"""`dflash2 compare`: the JSON record (every field, parity identical at T=0,
"in distribution" at T>0), the honest schedule (warm-ups, one arm at a time,
alternating order), the parity verdict's divergence report, the replay as a
pure function of time, and one-line errors."""

import json

import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.cli import ui
from dflash2_mlx.tools.compare import ArmRun, Parity, compare, parity, replay_frame
from dflash2_mlx.text.prompt import build_prompt
from dflash2_mlx.text.stats import GenerationStats
from helpers import ScriptedDrafter, ar_tokens, drafter_folder, load_pair_for, target_folder

SUMMARY_KEYS = {"decode_tps", "e2e_tps", "prompt_tps", "tokens", "prompt_s", "total_s", "target_passes",
                "peak_memory_gb"}


def base_argv(*extra):
    return ["compare", "--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2"),
            "-p", "Write a loop", "-m", 20, "--block-size", 4, *extra]


def test_json_record_at_greedy(cli, tmp_path):
    saved = tmp_path / "race.json"
    code, out, err = cli(base_argv("--json", "--no-live", "--repeats", 2, "--save", saved))
    assert code == 0, err
    assert out.count("\n") == 1  # one JSON object on stdout, nothing else
    record = json.loads(out)
    assert json.loads(saved.read_text()) == record
    assert record["kind"] == "dflash2-compare" and record["prompt"] == "Write a loop"
    assert record["parity"]["verdict"] == "identical" and "identical" in record["parity"]["message"]
    assert record["order"] == [["ar", "dflash2"], ["dflash2", "ar"]]  # alternating
    s = record["settings"]
    assert (s["max_tokens"], s["temperature"], s["seed"], s["block_size"], s["repeats"]) == (20, 0.0, 0, 4, 2)
    m = record["machine"]
    assert m["backend"] == "cpu" and m["device"] and m["mlx_version"]
    summary = record["summary"]
    assert SUMMARY_KEYS <= set(summary["ar"]) and SUMMARY_KEYS <= set(summary["spec"])
    for key in ("speedup_decode", "speedup_e2e", "mean_acceptance_length", "acceptance_rate"):
        assert isinstance(summary[key], float)
    assert len(summary["acceptance_by_position"]) == 3
    assert summary["speedup_decode"] == pytest.approx(summary["spec"]["decode_tps"] / summary["ar"]["decode_tps"])
    ar, spec = record["runs"]["ar"], record["runs"]["dflash2"]
    assert len(ar) == len(spec) == 2
    for run in ar + spec:
        n = len(run["token_ids"])
        assert n == 20 == run["stats"]["generation_tokens"]
        assert len(run["times_s"]) == len(run["from_draft"]) == len(run["pieces"]) == n
        assert run["times_s"] == sorted(run["times_s"]) and run["times_s"][0] == run["prompt_s"] > 0
        assert run["decode_tps"] == pytest.approx((n - 1) / (run["total_s"] - run["prompt_s"]))
        assert run["text"] == "".join(run["pieces"])
        assert run["stats"]["prompt_tokens"] == len(record["prompt_token_ids"])
        assert run["token_ids"] == ar[0]["token_ids"]  # greedy parity, every repeat
    assert spec[0]["stats"]["mode"] == "dflash2" and spec[0]["stats"]["block_size"] == 4
    assert ar[0]["stats"]["target_passes"] == 19


def test_sampling_says_in_distribution(cli):
    code, out, err = cli(base_argv("--json", "--temp", "0.8", "--seed", 3, "--repeats", 1))
    assert code == 0, err
    record = json.loads(out)
    assert record["parity"]["verdict"] == "distribution"
    assert "in distribution, not token for token" in record["parity"]["message"]
    assert record["settings"]["seed"] == 3 and record["settings"]["temperature"] == 0.8


def test_text_output_without_a_terminal(cli):
    code, out, err = cli(base_argv("--no-live", "--repeats", 1))
    assert code == 0, err
    assert "REPLAY" not in out and "at 1x" not in out  # nothing was replayed (issue 11 B6)
    for fragment in ("Measured run 1 of 1", "autoregressive", "DFlash 2 (block 4)", "decode tok/s (after prefill)",
                     "end-to-end tok/s", "target passes", "τ (tokens per target pass)", "acceptance by position",
                     "peak memory", "speedup:", "backend cpu", "parity: identical"):
        assert fragment in out, fragment
    assert "warming up: autoregressive" in err and "measuring (repeat 1/1): DFlash 2" in err


# -- the schedule and the numbers, with a drafter that gets accepted ---------------------------------


def test_honest_schedule_and_acceptance():
    target, tokenizer, base = load_pair_for("qwen3", "dflash2")
    ids = build_prompt(tokenizer, "Write a loop")
    N, B = 24, 4
    reference = ar_tokens(target, ids, N + 16)
    drafter = ScriptedDrafter(base, reference, len(ids), lambda c: c % B, target.vocab_size)
    events = []
    result = compare(Pair.make(target, drafter), tokenizer, ids, DecodeRequest(max_tokens=N, block_size=B), repeats=3,
                     on_arm=lambda phase, arm, i: events.append((phase, arm, i)))
    assert events == [("warmup", "ar", 0), ("warmup", "spec", 0), ("measure", "ar", 0), ("measure", "spec", 0),
                      ("measure", "spec", 1), ("measure", "ar", 1), ("measure", "ar", 2), ("measure", "spec", 2)]
    assert result.parity.verdict == "identical"
    spec = result.spec[0]
    assert any(spec.from_draft) and not any(result.ar[0].from_draft)
    s = result.summary()
    assert s["mean_acceptance_length"] > 1.5 and s["spec"]["target_passes"] < s["ar"]["target_passes"]
    assert all(0 < p <= 1 for p in s["acceptance_by_position"])
    assert s["spec"]["tokens"] == s["ar"]["tokens"] == N
    # Accepted drafts arrive in bursts with their cycle's bonus token, microseconds apart.
    gaps = [b - a for a, b in zip(spec.times, spec.times[1:])]
    assert sum(g < 2e-3 for g in gaps) >= sum(spec.from_draft)


# -- parity and replay as pure functions ----------------------------------------------------------------


def fake_run(mode, tokens, times, from_draft=None):
    n = len(tokens)
    stats = GenerationStats(prompt_tokens=5, generation_tokens=n, prompt_tps=100.0, generation_tps=10.0,
                            target_passes=n - 1, mean_acceptance_length=1.0, acceptance_by_position=[0.5, 0.25],
                            acceptance_histogram=[n - 1, 0, 0], drafted=4, accepted=1, peak_memory_gb=0.5,
                            backend="cpu", mode=mode, block_size=3)
    return ArmRun(mode, list(tokens), [f"<{t}>" for t in tokens], list(from_draft or [False] * n), list(times), stats)


def test_parity_reports_the_first_difference():
    a = fake_run("ar", [1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    assert parity(a, fake_run("dflash2", [1, 2, 3, 4], [0.1, 0.1, 0.1, 0.2]), greedy=True) == Parity("identical")
    p = parity(a, fake_run("dflash2", [1, 2, 9, 4], [0.1, 0.1, 0.1, 0.2]), greedy=True)
    assert (p.verdict, p.index, p.ar_token, p.spec_token) == ("diverged", 2, 3, 9)
    assert p.message == "diverged at token 2: plain decoding gave 3 '<3>', DFlash gave 9 '<9>'"
    short = parity(a, fake_run("dflash2", [1, 2], [0.1, 0.2]), greedy=True)
    assert (short.verdict, short.index, short.ar_token, short.spec_token) == ("diverged", 2, 3, None)
    assert parity(a, fake_run("dflash2", [7], [0.1]), greedy=False).verdict == "distribution"


def test_replay_is_a_pure_function_of_time():
    ar = fake_run("ar", [1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    spec = fake_run("dflash2", [1, 2, 3, 4], [0.1, 0.15, 0.15, 0.2], [False, True, False, False])
    assert replay_frame(ar, spec, 0.0) == replay_frame(ar, spec, 0.0)
    f = replay_frame(ar, spec, 0.15)
    assert (f.ar_shown, f.spec_shown, f.ar_done, f.spec_done) == (1, 3, False, False)
    f = replay_frame(ar, spec, 0.25)
    assert (f.ar_shown, f.spec_shown, f.spec_done) == (2, 4, True)
    assert replay_frame(ar, spec, 1.0).ar_done


def test_panes_render_labelled_replay_with_coloured_drafts():
    from dflash2_mlx.tools.compare import Comparison

    ar = fake_run("ar", [1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    spec = fake_run("dflash2", [1, 2, 3, 4], [0.1, 0.15, 0.15, 0.2], [False, True, False, False])
    comp = Comparison([5], {}, [ar], [spec], [["ar", "dflash2"]], {"backend": "cpu", "device": "x86_64",
                                                                    "mlx_version": "0"}, Parity("identical"))
    console = ui.make_console(width=120, record=True, color=True)
    console.print(ui.compare_panes(comp, replay_frame(ar, spec, 0.15), width=120, height=6))
    raw = console.file.getvalue()
    text = console.export_text()
    assert "REPLAY" in text and "one after the other" in text and "t = 0.15 s" in text
    assert "autoregressive" in text and "DFlash 2 (block 3)" in text
    assert "<1>" in text and "<3>" in text and "<4>" not in text  # AR shows 1 token, DFlash 2 three
    assert "\x1b[36m<2>" in raw and "\x1b[36m<1>" not in raw  # only the drafted token is coloured
    table = ui.make_console(width=120, record=True)
    table.print(ui.compare_table(comp))
    text = table.export_text()
    assert "speedup:" in text and "parity: identical" in text and "backend cpu" in text


# -- the command line ---------------------------------------------------------------------------------


def test_help(cli):
    code, out, _ = cli(["compare", "--help"])
    assert code == 0 and "never at the same time" in out
    for flag in ("--model", "--drafter", "--prompt", "--max-tokens", "--temp", "--seed", "--block-size",
                 "--repeats", "--json", "--save", "--no-live", "--replay-speed", "--chat-template-config"):
        assert flag in out, flag


@pytest.mark.parametrize("extra, code, fragment", [
    (["--bogus"], 2, "--bogus"),
    (["--repeats", "x"], 2, "repeats"),
    (["--repeats", "0"], 1, "--repeats 0"),
    (["--block-size", "17"], 1, "block_size 16"),
    (["--model", "/nonexistent/target"], 1, "does not exist"),
    (["-p", " "], 1, "empty"),
])
def test_bad_input_is_one_line_error(cli, extra, code, fragment):
    got, out, err = cli(base_argv(*extra))
    assert got == code, err
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and fragment in err
