"""`analyze` on tiny trained drafters: the tables are consistent with their definitions."""

import numpy as np

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.tools.analyze import analyze, markdown, teacher_forced
from dflash2_mlx.train.data import Packed
from dflash2_mlx.train.trainer import TrainConfig
from test_train import DATA, SMALL, run_until
from dflash2_mlx.train.setup import prepare
from helpers import target_folder


def test_analysis_tables(tmp_path):
    drafters = {}
    for name, kind, which in [("dflash", "dflash", "all"), ("dflash+conv", "dflash2", "no-selector"),
                              ("dflash2", "dflash2", "all")]:
        cfg = TrainConfig(steps=6, batch_size=4, blocks_per_seq=4, lr=3e-3, eval_every=100, save_every=100,
                          trainable=which)
        t = prepare(str(target_folder("qwen3")), DATA, tmp_path / name, config=cfg, **{**SMALL, "kind": kind})
        run_until(t)
        drafters[name] = t.drafter
    target = t.target
    heldout = Packed(t.heldout[:4], t.answers[id(t.heldout)][:4])
    result = analyze({k: Pair.make(target, d) for k, d in drafters.items()}, heldout, prompt_len=16, n_prompts=2, max_tokens=12, blocks_per_seq=4, cycles=2, cycle_repeats=2)
    v = result["variants"]
    for rec in v.values():
        tf = rec["teacher_forced"]
        assert all(0 <= x <= 1 for x in tf["recall1_by_position"] + tf["recallK_by_position"])
        assert tf["recallK_by_position"][0] >= tf["recall1_by_position"][0]
        assert tf["tau_oracle"] >= tf["tau_teacher_forced"] >= 1
        assert rec["T0"]["greedy_identical_to_ar"] == "2/2"
        assert all(0 < x <= 1 + 1e-6 for x in tf["topK_mass_by_position"]) and len(tf["topK_mass_by_position"]) == 7
        for T in ("T0", "T1"):
            acc = rec[T]["acceptance_by_position"]
            assert len(acc) == 7 and all(0 <= x <= 1 for x in acc)
            # τ = 1 + Σ_t P(first t+1 accepted): acceptance by position must reproduce the pooled τ.
            assert acc[0] > 0 or rec[T]["tau"] == 1.0
    conv_params = sum(p.size for layer in drafters["dflash2"].layers
                      for conv in (layer.attention_conv, layer.mlp_conv)
                      for p in (conv.base_kernel, conv.kernel_projection.weight))
    assert v["dflash+conv"]["extra_parameters"] == conv_params
    assert v["dflash2"]["extra_parameters"] > conv_params
    assert "| dflash2 |" in markdown(result, "test")
    # Cycle latency: one record per variant from alternating rounds, the median round's.
    for rec in v.values():
        rounds = sorted(rec["cycle"]["cycle_ms_untimed_rounds"])
        assert len(rounds) == 2 and rec["cycle"]["cycle_ms_untimed"] in rounds
    # Recall@1 at position 0 is exactly the share of blocks whose first draft is right.
    again = teacher_forced(Pair.make(target, drafters["dflash"]), heldout.tokens, 4, answers=heldout.answers)
    assert np.isclose(again["recall1_by_position"][0], v["dflash"]["teacher_forced"]["recall1_by_position"][0])


def test_analyze_command_writes_both_files(tmp_path):
    import json

    import pytest

    from dflash2_mlx.cli.main import main

    cfg = TrainConfig(steps=2, batch_size=4, blocks_per_seq=4, lr=3e-3, eval_every=100, save_every=100)
    t = prepare(str(target_folder("qwen3")), DATA, tmp_path / "d2", config=cfg, **SMALL)
    run_until(t)
    out = tmp_path / "report"
    argv = ["analyze", "--model", str(target_folder("qwen3")), "--data", DATA[0], "--heldout-fraction", "0.5",
            "--dflash2", str(tmp_path / "d2" / "drafter"), "--out", str(out), "--prompts", "1",
            "--max-tokens", "8", "--seq-len", "64", "--prompt-len", "16", "--tree", "4"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    rec = json.loads((out / "analysis.json").read_text())["variants"]["dflash2"]
    # --tree: the tree's decoded τ beside the chain's and the oracle's, greedy still exact.
    assert rec["T0_tree"]["greedy_identical_to_ar"] == "1/1" and rec["T1_tree"]["tau"] >= 1
    assert "a tree of 4 rows" in (out / "analysis.md").read_text()
    assert "| dflash2 |" in (out / "analysis.md").read_text()


def test_analyze_reports_progress_on_stderr_off_a_terminal(cli, tmp_path):
    """A run takes minutes: off a terminal (a log, a pipe) its progress is plain
    lines on stderr, one as each measurement starts, counting up to [N/N] done,
    where N is every teacher-forced batch, decoded prompt and cycle round."""
    import json
    import re
    from pathlib import Path

    from helpers import drafter_folder

    data = tmp_path / "heldout.py"
    data.write_text(Path(json.__file__).read_text()[:3000])
    out_dir = tmp_path / "report"
    code, out, err = cli(["analyze", "--model", target_folder("qwen3"), "--dflash2", drafter_folder("qwen3", "dflash2"),
                          "--data", data, "--heldout-fraction", "1", "--out", out_dir, "--prompts", "2",
                          "--max-tokens", "4", "--seq-len", "32", "--prompt-len", "8"])
    assert code == 0, err
    assert out == ""  # progress and notes on stderr only
    assert "\x1b" not in err  # plain lines, no bar or colour codes
    steps = [re.fullmatch(r"analyze \[(\d+)/(\d+)\] (.+)", line) for line in err.splitlines()
             if line.startswith("analyze [")]
    assert steps and all(steps), err
    done, totals, labels = [int(m[1]) for m in steps], {int(m[2]) for m in steps}, [m[3] for m in steps]
    heldout = json.loads((out_dir / "analysis.json").read_text())["heldout_sequences"]
    expected = -(-heldout // 8) + 2 * 2 + 5  # batches of 8 sequences, two decodes of 2 prompts, 5 cycle rounds
    assert totals == {expected}
    assert done == sorted(done) and done[0] == 0
    assert (done[-1], labels[-1]) == (expected, "done")  # every unit of work was counted as it started
    phases = [label.split(",")[0] for label in labels]
    phases = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    assert phases == ["dflash2: teacher-forced recall", "dflash2: decode at T=0", "dflash2: decode at T=1",
                      "dflash2: cycle latency", "done"]
