"""Time the fused kernels against their plain-MLX twins at a drafter's shapes.

    python benchmarks/decode/kernels.py --json benchmarks/results/kernels-metal.json   # on a Mac

Times, per call (median over --repeats after --warmup calls, each call
evaluated with mx.eval):
* two_tap_conv: x [blocks, block, hidden] with per-row group corrections;
* path_select, greedy and sampled: N = block - 1 positions, top-K candidates,
  rank-r codebooks with `vocab` rows each (gathered inside the call).
The kernel is timed only where `kernels.active` gives one (Metal, CUDA); the
JSON then also says whether it agreed with the twin on the timed inputs.
On a CPU-only machine only the twins are timed (a few seconds at the
default sizes, mostly generating the two 151936 x 256 codebooks).
"""

import argparse
import json
import platform
import statistics
import sys
import time

import mlx.core as mx

from dflash2_mlx.engine.drafter.fused import CHECKS, kernel_status
from dflash2_mlx.kernels import registry as kernels
from dflash2_mlx.engine.drafter.conv import two_tap_conv_ops
from dflash2_mlx.engine.drafter.selector import path_select_ops
from dflash2_mlx.tools.provenance import command_line, provenance

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def median_ms(fn, repeats: int, warmup: int) -> float:
    """Median wall time of `mx.eval(fn())` in milliseconds."""
    for _ in range(warmup):
        mx.eval(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def backend_name() -> str:
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return "cpu"


def conv_case(args, dtype):
    H, B, G = args.hidden, args.block, args.hidden // args.group_size
    x = mx.random.normal((args.blocks, B, H)).astype(dtype)
    delta = (0.1 * mx.random.normal((args.blocks, B, 2, G))).astype(dtype)
    base = mx.random.normal((2, H)).astype(dtype)
    return x, delta, base, args.group_size


def path_case(args, dtype):
    N, K, r, V = args.block - 1, args.top_k, args.rank, args.vocab
    unary = mx.random.normal((N, K))
    pred_ids = mx.random.randint(0, V, (N, K)).astype(mx.int32)
    cand_ids = mx.random.randint(0, V, (N, K)).astype(mx.int32)
    gate = mx.random.normal((N, r)).astype(dtype)
    A = (mx.random.normal((V, r)) / r**0.5).astype(dtype)
    B = mx.random.normal((V, r)).astype(dtype)
    uniforms = mx.random.uniform(shape=(N,))
    mx.eval(unary, pred_ids, cand_ids, gate, A, B, uniforms)
    return (unary, pred_ids, cand_ids, gate, A, B), uniforms


def bench(name, twin, kernel, args, compare) -> dict:
    """Twin (and kernel) timings for one case; `compare(kernel_out, twin_out)` -> bool."""
    row = {"twin_ms": median_ms(twin, args.repeats, args.warmup), "kernel_ms": None}
    if kernel is not None:
        row["agrees_with_twin"] = bool(compare(kernel(), twin()))
        row["kernel_ms"] = median_ms(kernel, args.repeats, args.warmup)
        row["speedup"] = row["twin_ms"] / row["kernel_ms"]
    cells = "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
    print(f"{name:22s} {cells}")
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--block", type=int, default=16,
                        help="block size; path_select walks block - 1 positions")
    parser.add_argument("--blocks", type=int, default=1, help="blocks per conv call")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--rank", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--temperature", type=float, default=1.0, help="for the sampled path_select case")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--cycle", action="store_true",
                        help="also measure a whole decode cycle on a synthetic mid-size DFlash 2 pair "
                             "and report the fused ops' share of it")
    args = parser.parse_args(argv)

    mx.random.seed(args.seed)
    dtype = DTYPES[args.dtype]
    conv_kernel = kernels.active("two_tap_conv", CHECKS["two_tap_conv"])
    path_kernel = kernels.active("path_select", CHECKS["path_select"])
    report = {
        **provenance(command_line("python benchmarks/decode/kernels.py", sys.argv[1:] if argv is None else argv)),
        "backend": backend_name(),
        "device": str(mx.default_device()),
        "mlx_version": mx.__version__,
        "platform": platform.platform(),
        "kernel_status": kernel_status(),
        "dtype": args.dtype,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "shapes": {
            "conv_x": [args.blocks, args.block, args.hidden],
            "conv_group_size": args.group_size,
            "path_positions": args.block - 1,
            "top_k": args.top_k,
            "rank": args.rank,
            "vocab": args.vocab,
        },
        "results": {},
    }
    print(f"backend {report['backend']}  mlx {report['mlx_version']}  kernels {report['kernel_status']}")

    conv_in = conv_case(args, dtype)
    mx.eval(*conv_in[:3])
    report["results"]["two_tap_conv"] = bench(
        "two_tap_conv",
        lambda: two_tap_conv_ops(*conv_in),
        conv_kernel and (lambda: conv_kernel(*conv_in)),
        args,
        lambda a, b: mx.allclose(a.astype(mx.float32), b.astype(mx.float32), rtol=2e-2, atol=2e-2).item(),
    )

    path_in, uniforms = path_case(args, dtype)
    same_picks = lambda a, b: mx.array_equal(a[0], b[0]).item()  # noqa: E731
    for label, temperature, u in (("greedy", 0.0, None), ("sampled", args.temperature, uniforms)):
        report["results"][f"path_select_{label}"] = bench(
            f"path_select_{label}",
            lambda: path_select_ops(*path_in, temperature=temperature, uniforms=u),
            path_kernel and (lambda: path_kernel(*path_in, temperature=temperature, uniforms=u)),
            args,
            same_picks,
        )

    if args.cycle:
        report["cycle_share"] = cycle_share(args)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return report


def cycle_share(args) -> dict:
    """Share of one decode cycle spent in the conv and the path walk.

    The path walk (with top-K and lattice) is the cycle's "select" phase; the
    conv runs four times per drafter layer inside the drafter forward, so its
    share is estimated from its per-call time at that pair's shapes.
    """
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cycle import synthetic_pair

    from dflash2_mlx.tools.cycle_profile import cycle_breakdown
    from dflash2_mlx.loading.load_pair import load_pair

    with tempfile.TemporaryDirectory() as tmp:
        pair, _ = load_pair(*synthetic_pair(Path(tmp), "mid"))
    drafter = pair.drafter
    B, H, L = args.block, drafter.config.hidden_size, len(drafter.layers)
    rec = cycle_breakdown(pair, list(range(10, 74)), cycles=8, block_size=B)
    x = mx.random.normal((1, B, H)).astype(drafter.activation_dtype)
    d = mx.zeros((1, B, 2, H // drafter.config.conv_group_size), x.dtype)
    base = mx.ones((2, H), x.dtype)
    conv = kernels.active("two_tap_conv", CHECKS["two_tap_conv"]) or two_tap_conv_ops
    conv_ms = median_ms(lambda: conv(x, d, base, drafter.config.conv_group_size), args.repeats, args.warmup)
    cycle_ms = rec["cycle_ms_timed"]
    out = {
        "pair": "synthetic mid (target 8x512, vocab 32768; 1-layer DFlash 2 drafter)",
        "block_size": B, "cycle_ms_timed": cycle_ms, "cycle_ms_untimed": rec["cycle_ms_untimed"],
        "select_ms": rec["phase_ms"]["select"], "select_share": rec["phase_share"]["select"],
        "conv_calls_per_cycle": 4 * L, "conv_ms_per_call": conv_ms,
        "conv_share_estimate": 4 * L * conv_ms / cycle_ms,
        "path": kernel_status(),
    }
    print(f"cycle {cycle_ms:.2f} ms: select {out['select_share']:.1%} | conv ~{out['conv_share_estimate']:.2%} "
          f"({4 * L} calls x {conv_ms:.3f} ms) [{out['path']}]")
    return out


if __name__ == "__main__":
    main()
