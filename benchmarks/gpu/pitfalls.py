"""The MLX CUDA pitfalls, measured in one step of the GPU check (check.py runs it).

    python benchmarks/gpu/pitfalls.py --json pitfalls.json [--quick] [--budget-s 60]

Read from MLX's CUDA source (mlx/backend/cuda/scaled_dot_product_attention.cpp and the
quantized matmul dispatch) and measured here, on the ~1B random qwen3 target of the
check (synthetic_pairs.py) quantized to 4 bits, at a 1,024-token context:

* `rows`: a target pass of R = 1..16 rows (each undone), and the same R rows padded to
  8 (8 rows run, R used: what another MLX project does to leave `qmv`, which re-reads
  the weights per row below 8 rows, for `qmm`). Padded wins where `padded_ms < ms`.
* `cudnn_off`: the same table in a child process started with MLX_CUDA_USE_CUDNN_SDPA=0
  (cuDNN attention off: MLX's own kernels, no plan cache).
* `deterministic`: the same 8-row verify twice (undone in between), at 320 and
  at 1,024 keys (cuDNN's decode engine past 256 keys is not deterministic run to run):
  whether the logits are bitwise equal (`engine/adaptive/exactness.py: repeatable`).

On the CPU (`--quick`) it runs tiny sizes to check the script; its numbers say nothing
about a GPU.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

ROWS = list(range(1, 17))
PAD_TO = 8


def quantized_pair(quick: bool):
    from mlx_lm.utils import quantize_model

    from dflash2_mlx.engine.pair import Pair
    from dflash2_mlx.engine.target.adapter import Target
    from synthetic_pairs import synthetic_target

    target, info = synthetic_target("1b", quick)
    model, _ = quantize_model(target.model, dict(info["config"]), group_size=64 if not quick else 32, bits=4)
    return Pair.make(Target(model)), {**info, "quantized": "4-bit"}


def rows_table(pair, context: int, repeats: int, deadline: float) -> dict:
    import mlx.core as mx

    target = pair.target
    cache = target.make_cache()
    ids = [(7 * i + 3) % 1999 + 10 for i in range(context + PAD_TO * 2)]
    mx.eval(target(mx.array([ids[:context]]), cache, (), last_logits_only=True)[0])

    def timed(n: int) -> float:
        tic = time.perf_counter()
        logits, features, undo = target.forward_undoable(mx.array([ids[context:context + n]]), cache, ())
        mx.eval(logits)
        target.rollback(cache, undo, 0)
        return 1e3 * (time.perf_counter() - tic)

    out = {}
    for R in ROWS:
        if time.monotonic() > deadline:
            break
        timed(R), timed(max(R, PAD_TO))  # each shape's first pass builds its graph: not timed
        ms = [timed(R) for _ in range(repeats)]
        padded = [timed(max(R, PAD_TO)) for _ in range(repeats)]
        out[str(R)] = {"ms": statistics.median(ms), "padded_ms": statistics.median(padded)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=60)
    ap.add_argument("--table-only", action="store_true", help=argparse.SUPPRESS)  # the cuDNN-off child
    args = ap.parse_args(argv)
    import mlx.core as mx

    from dflash2_mlx.engine.adaptive.exactness import repeatable

    start = time.monotonic()
    deadline = start + args.budget_s
    context, repeats = (64, 2) if args.quick else (1024, 5)
    pair, info = quantized_pair(args.quick)
    record = {"model": info, "context": context, "repeats": repeats, "pad_to": PAD_TO}
    share = 0.45 if args.table_only else 0.35
    record["rows"] = rows_table(pair, context, repeats, start + share * args.budget_s)
    if args.table_only:
        args.json.write_text(json.dumps(record))
        return
    child = args.json.with_suffix(".cudnn-off.json")
    env = {**os.environ, "MLX_CUDA_USE_CUDNN_SDPA": "0"}
    left = max(10.0, 0.45 * args.budget_s)
    try:
        subprocess.run([sys.executable, __file__, "--json", str(child), "--budget-s", f"{left:.0f}", "--table-only",
                        *(["--quick"] if args.quick else [])], env=env, check=True, timeout=left + 30)
        record["cudnn_off"] = json.loads(child.read_text())["rows"]
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        record["cudnn_off"] = {"error": str(e)}
    ids = [(7 * i + 3) % 1999 + 10 for i in range(64)]
    record["deterministic"] = {}
    for keys in (320, 1024 if not args.quick else 96):
        if time.monotonic() > deadline:
            break
        record["deterministic"][str(keys)] = repeatable(pair, ids, PAD_TO, context=keys)
    record["backend"] = "cuda" if mx.cuda.is_available() else "cpu"
    record["seconds"] = round(time.monotonic() - start, 1)
    args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
