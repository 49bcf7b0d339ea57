"""Which activation dtype and prefill step the target should run with, measured against mlx-lm.

    python benchmarks/long_context/prefill_policy.py --json benchmarks/results/prefill-policy-cpu.json \
        [--contexts 256 1024 4096 --decode 32 --repeats 2]

On the long-rope look-alike of the built-in pair (benchmarks/long_context/long_rope.py),
T = 0, no drafter (the target's prefill is what the policy decides; the
drafter's context pass is measured by long_context.py). Per context the arms
run one after the other, each in a fresh process (benchmarks/long_context/prefill_arm.py,
so each peak memory is its own), in an order rotating over --repeats:
mlx-lm's `stream_generate` with its defaults, and this package's `--ar` with
every (target dtype, prefill step) in --dtypes x --steps. Each arm prefills
the context then decodes --decode tokens; the JSON keeps every run, the
median prompt tok/s, decode tok/s and peak memory per arm, each against
mlx-lm's, and whether the tokens equal mlx-lm's. Run it on a quiet machine.
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from long_rope import long_rope_folders  # noqa: E402
from prefill_arm import run_arm  # noqa: E402


def arms(args, target: Path) -> dict:
    out = {"mlx_lm": {"engine": "mlx_lm", "target": str(target)}}
    for dtype in args.dtypes:
        for step in args.steps:
            out[f"{dtype}_step{step}"] = {"engine": "dflash2", "target": str(target), "dtype": dtype, "step": step}
    return out


def summarise(runs: dict) -> dict:
    base = runs["mlx_lm"]
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in ("prompt_tps", "prompt_cpu_tps",
                                                                      "generation_tps", "decode_cpu_tps",
                                                                      "peak_memory_bytes")}
           for arm, rs in runs.items()}
    ref = base[0]["tokens"]
    return {arm: {**m, "prompt_tps_vs_mlx_lm": m["prompt_tps"] / med["mlx_lm"]["prompt_tps"],
                  "prompt_cpu_tps_vs_mlx_lm": m["prompt_cpu_tps"] / med["mlx_lm"]["prompt_cpu_tps"],
                  "decode_tps_vs_mlx_lm": m["generation_tps"] / med["mlx_lm"]["generation_tps"],
                  "decode_cpu_tps_vs_mlx_lm": m["decode_cpu_tps"] / med["mlx_lm"]["decode_cpu_tps"],
                  "peak_memory_vs_mlx_lm": m["peak_memory_bytes"] / med["mlx_lm"]["peak_memory_bytes"],
                  "weights_bytes": runs[arm][0]["weights_bytes"], "target_dtype": runs[arm][0]["target_dtype"],
                  "tokens_equal_mlx_lm": all(r["tokens"] == ref for r in runs[arm]),
                  "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs[arm]]}
            for arm, m in med.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--steps", type=int, nargs="+", default=[2048, 512])
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded after the prompt")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-positions", type=int, default=32768)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        target, _ = long_rope_folders(Path(tmp), args.max_positions)
        specs = arms(args, target)
        names = list(specs)
        for context in args.contexts:
            runs = {name: [] for name in names}
            for r in range(args.repeats):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    runs[name].append(run_arm({**specs[name], "context": context, "decode": args.decode}))
            results[str(context)] = summarise(runs)
            print(f"context {context:,}: " + "; ".join(
                f"{a} {v['prompt_tps']:.0f} tok/s ({v['prompt_tps_vs_mlx_lm']:.2f}x, CPU time {v['prompt_cpu_tps_vs_mlx_lm']:.2f}x) "
                f"{v['peak_memory_bytes'] / 1e6:.1f} MB ({v['peak_memory_vs_mlx_lm']:.2f}x) "
                f"decode {v['decode_tps_vs_mlx_lm']:.2f}x (CPU time {v['decode_cpu_tps_vs_mlx_lm']:.2f}x)"
                for a, v in results[str(context)].items()), flush=True)
            record = {
                **provenance(command_line("python benchmarks/long_context/prefill_policy.py", sys.argv[1:] if argv is None else argv)),
                "backend": backend_name(), "machine": platform.machine(), "processor": platform.processor(),
                "pair": "builtin look-alike (long rope), no drafter", "max_positions": args.max_positions,
                "decode_tokens": args.decode, "repeats": args.repeats, "contexts": results,
            }
            atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")  # after each context: partial runs keep


if __name__ == "__main__":
    main()
