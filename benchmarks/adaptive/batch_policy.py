"""The batch block policy: how long a choice takes, how close its search gets, what its calibration costs.

    python benchmarks/adaptive/batch_policy.py --json benchmarks/results/batch-policy-cpu.json

1. Speed: `BatchPolicy.choose` for N = 1..16 sequences that may draft up to 16
   rows each, on two injected tables (a GPU-like one where 64 rows cost 1.6x one
   row, and a CPU-like one where a pass grows by a quarter of a one-row pass per
   row; illustrations, not measurements). Every sequence's acceptance observes a
   cycle before each choice, as in a running batch (so its expected tokens are
   recomputed each time, as they will be). Median and 99th percentile microseconds.
2. Search: on random tables and batches of 1-3 sequences, the chosen rate against
   a brute-force search over every combination of blocks.
3. Calibration: the rows sweep (`calibrate.target_rows_costs`, a target pass over
   1..64 rows after the calibration prompt) on the built-in pair, timed alone and
   with the whole `calibrate.measure`, and the batch costs and choices it gives.

The machine's load average is recorded before and after: on a shared machine
every timing here moves with it (run it on a quiet one to compare runs).
"""

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.adaptive.acceptance import AcceptanceEstimate  # noqa: E402
from dflash2_mlx.engine.adaptive.batch_policy import BatchCosts, BatchPolicy, SequenceView  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402

MS = 1e-3
ROWS = (1, 2, 4, 8, 16, 32, 64)
TABLES = {
    "gpu_like": BatchCosts({R: (10 + 0.1 * (R - 1)) * MS for R in ROWS}, {2: 1.0 * MS, 16: 1.7 * MS}),
    "cpu_like": BatchCosts({R: (8 + 2 * R) * MS for R in ROWS}, {2: 1.5 * MS, 16: 5 * MS}),
}


def speed(calls: int) -> dict:
    rng = random.Random(0)
    out = {}
    for name, costs in TABLES.items():
        for n in (1, 2, 4, 8, 16):
            seqs = [SequenceView(200, 100, 16, AcceptanceEstimate(15, [rng.uniform(0.2, 0.95)])) for _ in range(n)]
            policy, times, blocks = BatchPolicy(costs), [], None
            for _ in range(calls):
                for s in seqs:
                    s.acceptance.observe(4, rng.randint(0, 4))
                start = time.perf_counter()
                blocks = policy.choose(seqs)
                times.append(time.perf_counter() - start)
            times.sort()
            out[f"{name}/{n}"] = {"median_us": round(1e6 * statistics.median(times), 1),
                                  "p99_us": round(1e6 * times[int(0.99 * len(times))], 1), "last_blocks": blocks}
    return out


def search_quality(cases: int) -> dict:
    rng = random.Random(1)
    ratios = []
    for _ in range(cases):
        fixed, slope, curve = rng.uniform(1, 20), rng.uniform(0.01, 5), rng.uniform(0, 0.05)
        d0, dr = rng.uniform(0, 10), rng.uniform(0, 2)
        costs = BatchCosts({R: fixed + slope * R + curve * R * R for R in ROWS},
                           {D: d0 + dr * D for D in (2, 4, 8, 16)}, rng.uniform(0, 3))
        seqs = [SequenceView(rng.randint(1, 8), 10, rng.randint(1, 6),
                             AcceptanceEstimate(5, [rng.uniform(0, 1) for _ in range(5)]))
                for _ in range(rng.randint(1, 3))]
        policy = BatchPolicy(costs, margin=0.0)
        chosen = policy.rate(seqs, policy.choose(seqs))
        best = max(policy.rate(seqs, list(b)) for b in itertools.product(*(range(1, s.top() + 1) for s in seqs)))
        ratios.append(chosen / best)
    return {"cases": cases, "worst_ratio": round(min(ratios), 4), "below_0.999": sum(r < 0.999 for r in ratios),
            "at_optimum": sum(r >= 0.999999 for r in ratios)}


def calibration() -> dict:
    from dflash2_mlx.engine.adaptive.calibrate import measure, target_rows_costs
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.prompt import build_prompt
    from dflash2_mlx.tools.suites import SUITES

    pair, tokenizer = load_pair("builtin", "builtin")
    prompt = build_prompt(tokenizer, SUITES["code"][0])  # doctor's calibration prompt
    start = time.perf_counter()
    rows = target_rows_costs(pair, prompt)
    sweep = time.perf_counter() - start
    start = time.perf_counter()
    cal = measure(pair, prompt)
    whole = time.perf_counter() - start
    choices = {}
    for n in (1, 2, 4, 8, 16):
        seqs = [SequenceView(256, 0, pair.max_block_size,
                             AcceptanceEstimate(pair.max_block_size - 1, cal.acceptance))] * n
        choices[n] = cal.batch_policy().choose(seqs)
    return {"prompt_tokens": len(prompt), "rows_sweep_s": round(sweep, 2), "measure_s": round(whole, 2),
            "rows_sweep_ms": {R: round(1e3 * s, 3) for R, s in rows.items()},
            "batch": cal.batch.to_dict(), "acceptance": cal.acceptance, "choices": choices}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    record = {"backend": backend_name(), "machine": platform.machine(), "python": platform.python_version(),
              "cpus": os.cpu_count(), "speed": speed(args.calls), "search": search_quality(args.cases),
              "calibration": calibration()}
    record["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("speed", "search")}, indent=1))
    c = record["calibration"]
    print(f"rows sweep {c['rows_sweep_s']} s of a {c['measure_s']} s calibration; choices {c['choices']}")


if __name__ == "__main__":
    main()
