"""Data-parallel training throughput: one process vs two ranks, same global batch.

    python benchmarks/training/train_dp.py --json benchmarks/results/train-dp-cpu.json

Runs real `dflash2 train` jobs on the built-in target, one after the other
(never two at once): one process; `--processes 2` (mlx.launch, ring backend on
loopback, launcher deprioritized, see cli/ranks.py); and, unless
`--skip-raw`, plain `mlx.launch -n 2` to show what its spinning relay costs.
Tokens/s is the median of the per-step records in each run's metrics.jsonl
after `--warmup` steps (global batch tokens / step wall time, measured by
rank 0). The loss curves of the arms are compared step by step: same global
batch, so they should agree up to reduction order. Uses whatever MLX build is
installed (stock `mlx[cpu]` unless a BLAS shim is preloaded; the JSON records
which).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.train.trainer import read_metrics  # noqa: E402


def corpus(folder: Path) -> Path:
    """Training text every machine has: a slice of the stdlib."""
    import difflib
    import inspect

    path = folder / "corpus.txt"
    path.write_text(inspect.getsource(difflib) * 2)
    return path


def run_arm(name: str, launch: list[str], args: list[str], out: Path) -> dict:
    tic = time.perf_counter()
    proc = subprocess.run([*launch, *args, "--out", str(out)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - tic
    if proc.returncode != 0 or not (out / "drafter" / "model.safetensors").exists():
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return dict(name=name, command=" ".join([*launch, *args]), wall_s=round(wall, 2),
                steps=read_metrics(out, "step"))


def summarize(arm: dict, warmup: int) -> dict:
    steady = [s["tokens_per_s"] for s in arm["steps"][warmup:]]
    return dict(name=arm["name"], command=arm["command"], wall_s=arm["wall_s"],
                tokens_per_s_median=round(statistics.median(steady), 1),
                tokens_per_s_steps=[round(x, 1) for x in steady],
                loss_by_step=[round(s["loss"], 5) for s in arm["steps"]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--skip-raw", action="store_true", help="skip the plain mlx.launch arm")
    args = ap.parse_args()

    import mlx.core as mx

    dflash2 = shutil.which("dflash2") or sys.exit("dflash2 is not installed: pip install -e .")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        common = ["train", "--model", "builtin", "--data", str(corpus(tmp)), "--layers", "2",
                  "--block-size", "16", "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
                  "--steps", str(args.steps), "--selector-rank", "64", "--eval-every", "100000",
                  "--save-every", "100000", "--seed", "0"]
        arms = [run_arm("1 process", [dflash2], common, tmp / "one"),
                run_arm("2 ranks (dflash2 train --processes 2)", [dflash2], [*common, "--processes", "2"], tmp / "two")]
        if not args.skip_raw:
            arms.append(run_arm("2 ranks (plain mlx.launch -n 2)", ["mlx.launch", "-n", "2", "--backend", "ring", dflash2],
                                common, tmp / "raw"))
    rows = [summarize(a, args.warmup) for a in arms]
    base = rows[0]["tokens_per_s_median"]
    for r in rows:
        r["speedup_vs_1_process"] = round(r["tokens_per_s_median"] / base, 3)
        r["max_abs_loss_diff_vs_1_process"] = round(max(abs(a - b) for a, b in zip(r["loss_by_step"], rows[0]["loss_by_step"])), 5)
    result = dict(
        **provenance(command_line("python benchmarks/training/train_dp.py", sys.argv[1:])), benchmark="train_dp",
        backend=backend_name(),
        mlx=mx.__version__, machine=platform.machine(), cpus=os.cpu_count(),
        blas_shim="LD_PRELOAD" in os.environ, global_batch=args.batch_size, seq_len=args.seq_len,
        steps=args.steps, warmup_steps=args.warmup, arms=rows,
    )
    for r in rows:
        print(f"{r['name']:<40} {r['tokens_per_s_median']:>8.1f} tok/s  x{r['speedup_vs_1_process']:.2f}  "
              f"max |Δloss| {r['max_abs_loss_diff_vs_1_process']}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
