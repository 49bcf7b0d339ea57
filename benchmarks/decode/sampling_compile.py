"""Does mx.compile pay on the sampling primitives? The library's, plain, against their compiled twins.

    python benchmarks/decode/sampling_compile.py --json benchmarks/results/sampling-compile-cpu.json
    python benchmarks/decode/sampling_compile.py --instructions --json benchmarks/results/sampling-compile-instructions-cpu.json

(on the repository's shared CPU machine the background data job was paused for the timed run:
`pkill -STOP -f make_data.py; trap 'pkill -CONT -f make_data.py' EXIT; python ...`).

`plain` is engine/sampling.py as the decode loops call it: `make_logprobs_transform` (mlx-lm's
filters, which mlx-lm compiles itself, called in turn from a plain transform: float32,
log-softmax, filters, temperature) and `token_sampler` (that transform, then
`mx.random.categorical` with an explicit key; greedy: `greedy_token`, an argmax). `compiled` is
the same function under `mx.compile` as mlx-lm compiles its sampling primitives (the sampler with
`inputs=outputs=mx.random.state`): the transform as one graph, the sampler as transform and draw
in one graph. The library compiles a primitive only where this shows it pays.

Timed: per case (vocabulary, rows, settings) the two alternate call by call (which one goes
first alternates too), each call evaluated with mx.eval; the medians are reported, with each
one's first call (for the compiled one its trace and compile: on the CPU a new fused kernel is
built by the C++ compiler, then cached on disk) and whether the two give bitwise the same array.

--instructions counts instead (no other load moves the counts; wall-clock medians on a shared
2-core machine move by about 10 %): each arm runs in its own process under valgrind's
cachegrind, once with N1 and once with N2 calls after its first (trace, compile, imports and the
input cancel out), and (count(N2) - count(N1)) / (N2 - N1) is one call. A process's count moves
by about 20 M instructions from run to run (MLX's threads), so N2 - N1 is 40 calls of one row
(about 15 M instructions each at 151936) and 10 of 16 rows. Needs valgrind; about twenty minutes
at the default --cases on two cores.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# "greedy" has only a sampler (an argmax); the others a transform and a sampler.
SETTINGS = {
    "greedy": dict(),
    "t1": dict(temperature=1.0),
    "t1_top_p0.9": dict(temperature=1.0, top_p=0.9),
    "t1_top_k50": dict(temperature=1.0, top_k=50),
    "t1_min_p0.05": dict(temperature=1.0, min_p=0.05),
    "t0.7_top_p0.9_min_p0.05_top_k50": dict(temperature=0.7, top_p=0.9, min_p=0.05, top_k=50),
}
COUNT_CASES = [f"151936:1:{s}:{w}" for s in SETTINGS for w in (("sampler",) if s == "greedy" else
                                                               ("transform", "sampler"))] + [
    f"151936:16:{s}:{w}" for s, w in (("greedy", "sampler"), ("t1", "transform"), ("t1", "sampler"))]


def case_logits(vocab: int, rows: int, dtype: str, seed: int):
    import mlx.core as mx

    mx.random.seed(seed)
    shape = (vocab,) if rows == 1 else (rows, vocab)
    logits = (4 * mx.random.normal(shape)).astype(getattr(mx, dtype))  # a peaked, LM-like spread
    key = mx.random.key(seed)
    mx.eval(logits, key)
    return logits, key


def arms(settings: str, logits, key) -> dict:
    """what -> (plain call, compiled call) for one setting."""
    import mlx.core as mx

    from dflash2_mlx.engine.sampling import SamplingParams, greedy_token, make_logprobs_transform, token_sampler

    params = SamplingParams(**SETTINGS[settings])
    if params.greedy:
        compiled_greedy = mx.compile(greedy_token)
        return {"sampler": (lambda: greedy_token(logits), lambda: compiled_greedy(logits))}
    transform = make_logprobs_transform(params)
    sampler = token_sampler(params, transform)
    compiled_transform = mx.compile(transform)
    compiled_sampler = partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)(sampler)
    return {"transform": (lambda: transform(logits), lambda: compiled_transform(logits)),
            "sampler": (lambda: sampler(logits, key), lambda: compiled_sampler(logits, key))}


# -- timed ----------------------------------------------------------------------------------

def timed(fn) -> float:
    import mlx.core as mx

    start = time.perf_counter()
    mx.eval(fn())
    return 1e3 * (time.perf_counter() - start)


def race(plain, compiled, repeats: int, warmup: int) -> dict:
    """First calls, then `repeats` alternating timed calls of each; medians in ms."""
    import mlx.core as mx
    import numpy as np

    row = {"plain_first_ms": timed(plain), "compiled_first_ms": timed(compiled)}
    for _ in range(warmup):
        mx.eval(plain(), compiled())
    times = {"plain": [], "compiled": []}
    for i in range(repeats):
        order = (("plain", plain), ("compiled", compiled))
        for name, fn in order if i % 2 == 0 else order[::-1]:
            times[name].append(timed(fn))
    row["plain_ms"] = statistics.median(times["plain"])
    row["compiled_ms"] = statistics.median(times["compiled"])
    row["speedup"] = row["plain_ms"] / row["compiled_ms"]
    row["bitwise_equal"] = bool(np.array_equal(np.array(plain()), np.array(compiled())))
    return row


def time_cases(args, report: dict) -> None:
    print(f"{'vocab':>6} {'rows':>4} {'settings':34} {'what':9} {'plain':>8} {'compiled':>8} {'speedup':>7}  "
          f"{'1st plain':>9} {'1st compiled':>12}  bitwise")
    for vocab in args.vocab:
        for rows in args.rows:
            logits, key = case_logits(vocab, rows, args.dtype, args.seed)
            for settings in SETTINGS:
                for what, (plain, compiled) in arms(settings, logits, key).items():
                    row = {"vocab": vocab, "rows": rows, "settings": settings, "what": what,
                           **race(plain, compiled, args.repeats, args.warmup)}
                    report["results"].append(row)
                    print(f"{vocab:>6} {rows:>4} {settings:34} {what:9} {row['plain_ms']:8.3f} "
                          f"{row['compiled_ms']:8.3f} {row['speedup']:7.3f}  {row['plain_first_ms']:9.3f} "
                          f"{row['compiled_first_ms']:12.3f}  {row['bitwise_equal']}", flush=True)
    speedups = [r["speedup"] for r in report["results"]]
    report["speedup_median"], report["speedup_range"] = statistics.median(speedups), [min(speedups), max(speedups)]
    print(f"plain / compiled: median {report['speedup_median']:.3f}, range {min(speedups):.3f} .. {max(speedups):.3f}")


# -- instructions ---------------------------------------------------------------------------

def run_calls(spec: str, calls: int, dtype: str, seed: int) -> None:
    """The child under valgrind: one arm (vocab:rows:settings:what:variant), its first call, then `calls`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from valgrind import tolerate_rlimits

    tolerate_rlimits()
    import mlx.core as mx

    vocab, rows, settings, what, variant = spec.split(":")
    logits, key = case_logits(int(vocab), int(rows), dtype, seed)
    fn = arms(settings, logits, key)[what][variant == "compiled"]
    mx.eval(fn())
    for _ in range(calls):
        mx.eval(fn())


def count(spec: str, calls: int, args) -> int:
    """cachegrind's instruction count of one child process running `calls` calls of an arm."""
    err = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, __file__, "--calls", spec, str(calls), "--dtype", args.dtype,
                          "--seed", str(args.seed)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}).stderr
    return int(re.search(r"I\s+refs:\s+([\d,]+)", err)[1].replace(",", ""))


def count_cases(args, report: dict) -> None:
    """Per case and variant, (count(N2) - count(N1)) / (N2 - N1); the children run --jobs at a time."""
    from concurrent.futures import ThreadPoolExecutor

    runs = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for case in args.cases:
            n2 = 1 + (args.calls_one_row if case.split(":")[1] == "1" else args.calls_more_rows)
            for variant in ("plain", "compiled"):
                for n in (1, n2):
                    runs[case, variant, n] = pool.submit(count, f"{case}:{variant}", n, args)
    print(f"{'case':52} {'plain':>14} {'compiled':>14} {'plain/compiled':>14}")
    for case in args.cases:
        (_, _, n1), (_, _, n2) = [k for k in runs if k[:2] == (case, "plain")]
        row = {"case": case, "calls": [n1, n2]}
        for variant in ("plain", "compiled"):
            row[f"{variant}_counts"] = [runs[case, variant, n].result() for n in (n1, n2)]
            row[f"{variant}_instructions"] = (row[f"{variant}_counts"][1] - row[f"{variant}_counts"][0]) / (n2 - n1)
        row["ratio"] = row["plain_instructions"] / row["compiled_instructions"]
        report["instructions"].append(row)
        print(f"{case:52} {row['plain_instructions']:14,.0f} {row['compiled_instructions']:14,.0f} "
              f"{row['ratio']:14.3f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16],
                        help="1: a plain decoding step's [V] row; more: a verified block's [rows, V]")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                        help="the logits' dtype (the CPU runs its targets in float32)")
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per call under valgrind instead of timing")
    parser.add_argument("--cases", nargs="+", default=COUNT_CASES, help="with --instructions: vocab:rows:settings:what")
    parser.add_argument("--calls-one-row", type=int, default=40,
                        help="with --instructions: N2 - N1 for a one-row case (N1 = 1)")
    parser.add_argument("--calls-more-rows", type=int, default=10, help="with --instructions: N2 - N1 otherwise")
    parser.add_argument("--jobs", type=int, default=2, help="with --instructions: valgrind children at a time")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--calls", nargs=2, metavar=("SPEC", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.calls:
        return run_calls(args.calls[0], int(args.calls[1]), args.dtype, args.seed)

    import mlx.core as mx

    from dflash2_mlx.device import backend_name
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    report = {
        **provenance(command_line("python benchmarks/decode/sampling_compile.py",
                                  sys.argv[1:] if argv is None else argv)),
        "backend": backend_name(), "mlx_version": mx.__version__, "platform": platform.platform(),
        "dtype": args.dtype,
    }
    print(f"backend {report['backend']}  mlx {report['mlx_version']}  dtype {args.dtype}")
    if args.instructions:
        report["instructions"] = []
        count_cases(args, report)
    else:
        report.update(repeats=args.repeats, warmup=args.warmup, results=[])
        time_cases(args, report)
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
