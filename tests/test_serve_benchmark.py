"""`benchmarks/serve.py --smoke` end to end: real servers (every dflash2 arm and mlx_lm.server
on the built-in target, offline), one valid JSON record; and the ratios it reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import serve  # noqa: E402  (benchmarks/serve.py)


@pytest.mark.slow
def test_smoke_runs_every_arm_and_writes_json(tmp_path):
    out = tmp_path / "serve.json"
    # mlx_lm.server loads the built-in target's folder, so it runs offline: no skip needed.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert [a["arm"] for a in record["arms"]] == list(serve.ARMS)
    assert record["clients"] == [1] and record["max_tokens"] == 4 and record["backend"]
    for arm in record["arms"]:
        (run,) = arm["runs"]
        assert run["clients"] == 1 and run["requests"] == 1
        assert 1 <= run["completion_tokens"] <= 4 and run["tokens_per_s"] > 0
        assert run["ttft_median_s"] > 0 and run["x_mlx_lm"] > 0 and run["x_best_dflash2"] > 0
        assert arm["arm"] == "mlx_lm" or run["x_best_dflash2"] <= 1.0
        assert arm["arm"] in done.stdout  # the printed table has a row per arm
    rows = record["requests"]
    assert len(rows) == 4 and all(r["prompt"] == 0 for r in rows)
    # T = 0: today's server and --ar write the same text; this is the product's promise, so it is asserted.
    assert all(r["parity"] for r in rows if r["arm"] != "mlx_lm")
    assert record["reference_texts"]["0"]
    serial = next(a for a in record["arms"] if a["arm"] == "serial")
    if record["dflash2_serve_batches"]:  # usage says the batch each request ran in, and the server's bound
        assert serial["command"].endswith("--max-batch 1") and serial["runs"][0]["server_max_batch"] == 1
        assert all(a["runs"][0]["batch_max"] == 1 for a in record["arms"] if a["arm"] != "mlx_lm")
    else:
        assert record["note"] and "--max-batch" not in serial["command"]
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file and a rename


def test_ratios_are_per_client_count():
    def run(arm, clients, tps):
        return {"arm": arm, "clients": clients, "tokens_per_s": tps}

    arms = [{"runs": [run("dflash2", 1, 30.0), run("dflash2", 4, 60.0)]},
            {"runs": [run("ar", 1, 40.0), run("ar", 4, 50.0)]},
            {"runs": [run("mlx_lm", 1, 20.0), run("mlx_lm", 4, 120.0)]}]
    serve.add_ratios(arms)
    d1, d4 = arms[0]["runs"]
    assert (d1["x_mlx_lm"], d1["x_best_dflash2"]) == (1.5, 0.75)
    assert (d4["x_mlx_lm"], d4["x_best_dflash2"]) == (0.5, 1.0)
    assert arms[2]["runs"][1]["x_best_dflash2"] == 2.0  # mlx_lm over the best dflash2 arm
    assert serve.quantile([5, 1, 4, 2, 3], 0.9) == 5 and serve.quantile([], 0.9) is None
