"""Fresh `dflash2 generate` processes, auto against --ar, after a calibration made on a busy machine.

    python benchmarks/adaptive/fresh_cli.py --runs 5 --json benchmarks/results/fresh-cli-cpu.json

As users run it: every run is a new process (`python -m dflash2_mlx.cli generate -m 200
--json`, the built-in pair unless --model), one arm at a time in a rotating order. First, in an empty user
cache (XDG_CACHE_HOME pointed at a temporary folder holding only the fetched models), one
run with `--busy` spinning processes beside it measures the costs auto reads (the first
estimate, as a fresh machine gets it); every timed run then reads that stale calibration.
Per prompt and arm: the median decode tokens/s (the run's own `generation_tps`) and wall
seconds of the process, and auto / ar of each. Outputs are checked token-identical.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# The prompts as a shell passes `-p "..."`: a typed \n stays two characters.
PROMPTS = (r"class Stack:\n    def __init__(self):\n", r"import json\n\n\ndef load_config(path):\n", "def fib(n):")
BUSY = "while True: pass"


def generate(prompt: str, ar: bool, env: dict, max_tokens: int, model: str) -> dict:
    cmd = [sys.executable, "-m", "dflash2_mlx.cli", "generate", "--model", model, "--prompt", prompt,
           "-m", str(max_tokens), "--json", *(["--ar"] if ar else [])]
    tic = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - tic
    if done.returncode != 0:
        raise SystemExit(f"generate failed: {done.stderr.strip().splitlines()[-1:]}")
    record = json.loads(done.stdout)
    return {"wall_s": wall, "decode_tps": record["stats"]["generation_tps"], "tokens": record["token_ids"],
            "plain_share": record["stats"].get("plain_share"), "block_sizes": record["stats"].get("block_sizes")}


def main(argv=None):
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--model", default="builtin")
    ap.add_argument("--models-cache", type=Path, default=Path.home() / ".cache" / "dflash2-mlx" / "models",
                    help="the fetched models (linked into the empty cache)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as home:
        (Path(home) / "dflash2-mlx").mkdir()
        (Path(home) / "dflash2-mlx" / "models").symlink_to(args.models_cache)
        env = {**os.environ, "XDG_CACHE_HOME": home}
        spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
        try:
            tic = time.perf_counter()
            generate(PROMPTS[0], False, env, 8, args.model)  # the calibration, measured busy
            busy_s = time.perf_counter() - tic
        finally:
            for s in spinners:
                s.kill()
        results = {}
        for prompt in PROMPTS:
            runs = {"ar": [], "auto": []}
            for i in range(args.runs):
                for arm in (("ar", "auto") if i % 2 == 0 else ("auto", "ar")):
                    runs[arm].append(generate(prompt, arm == "ar", env, args.max_tokens, args.model))
            med = {arm: statistics.median(r["decode_tps"] for r in rs) for arm, rs in runs.items()}
            wall = {arm: statistics.median(r["wall_s"] for r in rs) for arm, rs in runs.items()}
            results[prompt] = {"decode_tps_median": med, "wall_s_median": wall,
                               "auto_over_ar": med["auto"] / med["ar"], "wall_ar_over_auto": wall["ar"] / wall["auto"],
                               "identical": all(r["tokens"] == runs["ar"][0]["tokens"] for rs in runs.values()
                                                for r in rs),
                               "runs": {arm: [{k: v for k, v in r.items() if k != "tokens"} for r in rs]
                                        for arm, rs in runs.items()}}
            print(f"{prompt[:40]!r}: auto/ar {results[prompt]['auto_over_ar']:.3f}", flush=True)
    record = {"benchmark": "fresh-cli", **provenance(command_line(Path(sys.executable).name, sys.argv)),
              "model": args.model, "max_tokens": args.max_tokens, "runs": args.runs, "busy_processes": args.busy,
              "busy_calibration_run_s": busy_s, "prompts": results}
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
