"""Target passes and collective time per generated token: AR vs DFlash 2, one
process vs the target split over two ranks.

    python benchmarks/decode/distributed.py --json benchmarks/results/distributed-cpu.json

Runs real `dflash2 generate --json` commands on the built-in pair, one after
the other (never two at once; the order alternates over `--repeats`), with and
without `--processes 2` (ring backend on loopback). From each run's stats:
target passes per generated token (after the first), collectives per pass, and
the seconds spent in collectives per pass and per token (timed by the sharded
target: graph evaluated before and after each all_sum, so waiting for the
other rank counts). Tokens/s is recorded with the machine's load average: on a
2-core CPU shared with other jobs it says little; the pass counts are what
carries over to other machines.

The JSON's `calculation` section is a calculation, not a measurement: the
communication time per token a two-Mac Thunderbolt link would add, from the
measured passes per token, the collectives per pass of a stated target depth,
and a stated per-collective latency.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402

PROMPT = "def parse_header(line):\n    "


def run_arm(mode: str, ranks: int, args) -> dict:
    cmd = [sys.executable, "-m", "dflash2_mlx.cli", "generate", "--prompt", PROMPT, "--ignore-chat-template",
           "--max-tokens", str(args.max_tokens), "--json"]
    cmd += ["--ar"] if mode == "ar" else ["--block-size", str(args.block_size)]
    if ranks > 1:
        cmd += ["--processes", str(ranks)]
    tic = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=ROOT)
    wall = time.perf_counter() - tic
    if proc.returncode != 0:
        raise SystemExit(f"{mode} × {ranks} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    record = json.loads(proc.stdout)
    s = record["stats"]
    after_first = s["generation_tokens"] - 1
    passes_per_token = s["target_passes"] / after_first
    per_pass = s.get("collective_s_per_pass")
    return dict(
        mode=mode, ranks=ranks, command=" ".join(cmd[1:]), wall_s=round(wall, 2),
        token_ids=record["token_ids"], generation_tokens=s["generation_tokens"],
        target_passes=s["target_passes"], passes_per_token=passes_per_token,
        mean_acceptance_length=s["mean_acceptance_length"],
        collectives_per_pass=s.get("collectives_per_pass"),
        collective_s_per_pass=per_pass,
        collective_s_per_token=per_pass * passes_per_token if per_pass is not None else None,
        generation_tps=s["generation_tps"],
    )


def summarize(runs: list[dict]) -> dict:
    first = runs[0]
    med = lambda key: statistics.median(r[key] for r in runs) if first[key] is not None else None  # noqa: E731
    return dict(
        mode=first["mode"], ranks=first["ranks"], command=first["command"], runs=len(runs),
        generation_tokens=first["generation_tokens"], target_passes=first["target_passes"],
        passes_per_token=round(first["passes_per_token"], 4),
        mean_acceptance_length=round(first["mean_acceptance_length"], 3),
        collectives_per_pass=first["collectives_per_pass"],
        collective_ms_per_pass_median=None if med("collective_s_per_pass") is None
        else round(1e3 * med("collective_s_per_pass"), 3),
        collective_ms_per_token_median=None if med("collective_s_per_token") is None
        else round(1e3 * med("collective_s_per_token"), 3),
        generation_tps_median=round(med("generation_tps"), 2),
    )


def calculation(arms: dict, layers: int, latency_us: float) -> dict:
    """Communication per token on a 2-rank link, from measured pass counts."""
    per_pass_ms = 2 * layers * latency_us / 1e3  # two all_sums per layer (attention, MLP)
    out = dict(
        label="calculation, not a measurement",
        assumptions=dict(
            target_layers=layers, collectives_per_pass=2 * layers,
            latency_per_collective_us=latency_us,
            why=("mlx-lm tensor parallelism runs two all_sums per decoder layer; at batch 1 each moves a "
                 "few KB to tens of KB, so its cost is the link's round-trip latency, taken here as stated, "
                 "not measured (no Thunderbolt link on this machine)"),
        ),
        formula="comm ms/token = passes_per_token × collectives_per_pass × latency",
        comm_ms_per_pass=round(per_pass_ms, 3),
    )
    for mode in ("ar", "dflash2"):
        ppt = arms[f"{mode}-2"]["passes_per_token"]
        out[f"{mode}_comm_ms_per_token"] = round(ppt * per_pass_ms, 3)
    out["dflash2_saving_factor"] = round(out["ar_comm_ms_per_token"] / out["dflash2_comm_ms_per_token"], 2)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/distributed-cpu.json")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--calc-layers", type=int, default=64, help="target depth for the calculation (64: Qwen3-32B)")
    p.add_argument("--calc-latency-us", type=float, default=50.0,
                   help="stated per-collective latency for the calculation")
    args = p.parse_args()

    order = [("ar", 1), ("dflash2", 1), ("ar", 2), ("dflash2", 2)]
    runs = {f"{m}-{r}": [] for m, r in order}
    for i in range(args.repeats):
        for mode, ranks in (order if i % 2 == 0 else order[::-1]):
            runs[f"{mode}-{ranks}"].append(run_arm(mode, ranks, args))
    arms = {k: summarize(v) for k, v in runs.items()}
    parity = {mode: runs[f"{mode}-1"][0]["token_ids"] == runs[f"{mode}-2"][0]["token_ids"]
              for mode in ("ar", "dflash2")}
    result = dict(
        **provenance(command_line("python", sys.argv)),
        benchmark="distributed", argv=sys.argv, backend=backend_name(), machine=platform.machine(),
        cpu_count=os.cpu_count(), load_average_at_end=os.getloadavg(), pair="builtin (target + DFlash 2 drafter)",
        max_tokens=args.max_tokens, block_size=args.block_size,
        tokens_identical_one_vs_two_ranks=parity, arms=arms,
        calculation=calculation(arms, args.calc_layers, args.calc_latency_us),
    )
    atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "argv"}, indent=2))


if __name__ == "__main__":
    main()
