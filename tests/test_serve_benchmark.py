"""`benchmarks/serve/serve.py --smoke` end to end: real servers (every dflash2 arm and mlx_lm.server
on the built-in target, offline), one valid JSON record; and the ratios it reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "serve"))

import serve  # noqa: E402  (benchmarks/serve/serve.py)


@pytest.mark.slow
def test_smoke_runs_every_arm_and_writes_json(tmp_path):
    out = tmp_path / "serve.json"
    # mlx_lm.server loads the built-in target's folder, so it runs offline: no skip needed.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve" / "serve.py"), "--smoke", "--json", str(out)],
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


def test_interleave_runs_every_arms_phase_in_turn_at_each_client_count(monkeypatch):
    """`--interleave`: each repeat starts every arm's server, then at each client count runs
    every arm's phase back to back, the order reversed every other phase; servers stop last."""
    events = []
    monkeypatch.setattr(serve, "start_arm", lambda name, args, has: events.append(("start", name)) or
                        (f"cmd {name}", name, f"url-{name}", "m"))
    monkeypatch.setattr(serve, "run_phase", lambda url, model, clients, args, ref: events.append(
        ("phase", url[4:], clients)) or (1.0, [{"usage": {"completion_tokens": 4}, "client": 0, "prompt": 0,
                                               "ttft_s": 0.1, "latency_s": 0.2, "arrivals_s": [0.1],
                                               "parity": True}]))
    monkeypatch.setattr(serve, "stop_server", lambda proc: events.append(("stop", proc)))
    args = serve.parse_args(["--clients", "1,4", "--repeats", "2", "--arms", "dflash2,ar,mlx_lm", "--interleave"])
    arms, requests, _ = serve.run_all(args, True)
    phases = [e[1:] for e in events if e[0] == "phase"]
    assert phases == [("dflash2", 1), ("ar", 1), ("mlx_lm", 1), ("mlx_lm", 4), ("ar", 4), ("dflash2", 4),
                      ("mlx_lm", 1), ("ar", 1), ("dflash2", 1), ("dflash2", 4), ("ar", 4), ("mlx_lm", 4)]
    first, second = events[: len(events) // 2], events[len(events) // 2:]
    for half in (first, second):  # every server up before the first phase, all stopped after the last
        assert [e[0] for e in half] == ["start"] * 3 + ["phase"] * 6 + ["stop"] * 3
    assert [a["arm"] for a in arms] == ["dflash2", "ar", "mlx_lm"]
    assert all(run["repeats"] == 2 for a in arms for run in a["runs"]) and len(requests) == 12
