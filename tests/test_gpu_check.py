"""benchmarks/gpu: the GPU check's CPU dry run end to end (every section, parity on every row),
its verdicts computed from a hand-made record, and run.sh refusing to run without CUDA."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import verdicts  # noqa: E402  (benchmarks/gpu/verdicts.py)

SECTIONS = {"environment", "steps", "decode", "verify", "cycle", "serve", "kernels", "pitfalls", "verdicts"}
SCRIPTED = [f"{arm} alpha {a}" for a in (0.8, 0.6) for arm in ("block 2", "block 4", "block 8", "block 16", "tree 8",
                                                                  "auto")]
ARMS = {"builtin": {"plain", "mlx_lm", "block 2", "block 4", "block 8", "block 16", "tree 8", "auto"},
        "1b": {"plain", "mlx_lm", *SCRIPTED}, "6b": {"plain", "mlx_lm", *SCRIPTED}}


@pytest.mark.slow
def test_cpu_dry_run_writes_every_section_and_parity_per_row(tmp_path):
    env = {**os.environ, "DRY_RESULTS": str(tmp_path), "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--cpu-dry-run"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    record = json.loads((tmp_path / "gpu-check.json").read_text())
    assert SECTIONS <= set(record)
    env_ = record["environment"]
    assert env_["quick"] and env_["backend"] == "cpu" and env_["mlx_version"] and env_["device_name"]
    assert all(s["status"] == "done" for name, s in record["steps"].items() if name != "total"), record["steps"]
    pitfalls = record["pitfalls"]  # the 4-bit target's rows padded to 8 or not, cuDNN off, the verify twice
    assert set(pitfalls["rows"]) == {str(R) for R in range(1, 17)} and set(pitfalls["cudnn_off"]) == set(pitfalls["rows"])
    assert all(r["ms"] > 0 and r["padded_ms"] > 0 for r in pitfalls["rows"].values())
    assert pitfalls["deterministic"] and all(pitfalls["deterministic"].values())  # the CPU backend repeats itself
    for pair, arms in ARMS.items():
        rows = record["decode"][pair]["rows"]
        keys = {r["arm"] if r["alpha"] is None else f"{r['arm']} alpha {r['alpha']}" for r in rows}
        assert keys == arms and not record["decode"][pair]["skipped_for_time"]
        for r in rows:
            # On the CPU every arm, mlx-lm's generate_step included, is plain decoding token for token.
            assert r["identical_to_plain"] is True and r["first_divergence"] is None, r
            assert r["runs"] == 2 and r["decode_tps_median"] > 0 and r["tokens_compared"] == 12
        assert [c["block_size"] for c in record["cycle"][pair]] == [4, 16]
        assert all(c["one_sync_over_phase_sum"] > 0 for c in record["cycle"][pair])
        table = record["verify"][pair]
        assert set(table["ms"]) == {"new_length", "same_length"}
        assert all(set(by_rows) == {"1", "2", "4", "8", "16"} for by_rows in table["ms"]["new_length"].values())
    assert {a["arm"] for a in record["serve"]["arms"]} == {"dflash2", "ar", "mlx_lm"}
    assert record["serve"]["clients"] == [1, 4, 8]
    v = record["verdicts"]
    for name in ("one_sync_cycle_vs_phase_sum", "verify16_vs_plain_step_6b", "block4_vs_plain_6b_alpha0.8",
                 "block4_vs_plain_1b_alpha0.8", "auto_vs_best_fixed_block", "serve_auto_vs_ar", "greedy_parity"):
        assert v[name]["pass"] in (True, False) and v[name]["values"], name  # every number was measured
    assert v["greedy_parity"]["pass"] is True and v["all_must_show_pass"] in (True, False)
    assert (tmp_path / "gpu-check-logs" / "pair-6b.log").exists()
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file and a rename


def test_verdicts_pass_fail_and_missing():
    def row(pair, arm, tps, alpha=None, first=None):
        return {"pair": pair, "arm": arm, "alpha": alpha, "decode_tps_median": tps,
                "identical_to_plain": first is None, "first_divergence": first}

    record = {"decode": {"6b": {"rows": [row("6b", "plain", 10.0), row("6b", "block 4", 21.0, 0.8),
                                         row("6b", "block 8", 25.0, 0.8), row("6b", "auto", 22.0, 0.8, first=40)]}},
              "verify": {"6b": {"verify16_over_plain": {"new_length": {"256": 1.2, "4096": 1.6}}}},
              "cycle": {"6b": [{"block_size": 4, "cycle_ms_untimed": 9.0, "phase_sum_ms": 8.0,
                                "one_sync_over_phase_sum": 1.125}]}}
    v = verdicts.verdicts(record)
    assert v["block4_vs_plain_6b_alpha0.8"] == {**v["block4_vs_plain_6b_alpha0.8"], "pass": True,
                                                "values": {"ratio": 2.1}}
    assert v["block4_vs_plain_1b_alpha0.8"]["pass"] is None  # not measured
    assert v["verify16_vs_plain_step_6b"]["pass"] is False  # 1.6 at 4096
    assert v["one_sync_cycle_vs_phase_sum"]["pass"] is True
    assert v["auto_vs_best_fixed_block"]["values"]["6b alpha 0.8"] == {"ratio": 0.88, "best_fixed": "block 8"}
    assert v["auto_vs_best_fixed_block"]["pass"] is False
    assert v["serve_auto_vs_ar"]["pass"] is None and v["all_must_show_pass"] is None
    assert v["greedy_parity"]["pass"] is False and v["greedy_parity"]["values"]["diverged"] == {"6b auto alpha 0.8": 40}
    assert "FAIL  verify16_vs_plain_step_6b" in verdicts.table(v)
    record["serve"] = {"clients": [1, 4, 8], "arms": [
        {"arm": "dflash2", "runs": [{"clients": c, "tokens_per_s": 100.0} for c in (1, 4, 8)]},
        {"arm": "ar", "runs": [{"clients": c, "tokens_per_s": 100.0 + c} for c in (1, 4, 8)]}]}
    s = verdicts.verdicts(record)["serve_auto_vs_ar"]
    assert s["pass"] is False and s["values"]["1 clients"] == 0.9901 and s["values"]["8 clients"] == 0.9259


def test_run_sh_refuses_without_cuda(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)})
    assert done.returncode == 2 and "gpu-stage.sh" in done.stderr and "--cpu-dry-run" in done.stderr
    assert not list(tmp_path.iterdir())
