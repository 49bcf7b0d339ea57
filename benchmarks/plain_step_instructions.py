"""What a plain step of `--block-size auto` costs against `--ar`, in instructions.

    python benchmarks/plain_step_instructions.py --json docs/results/plain-step-instructions-cpu.json

On this CPU auto decodes plainly (drafting cannot pay here), so auto against
`--ar` is the cost of its plain steps against plain decoding's: the policy's
decision and the capture of the drafter's target layers (so drafting can
resume). Wall-clock ratios of two ~1.5 s runs move by ±15 % on this machine
(its host takes CPU time away), so this counts instructions instead, which
no other load changes: each arm decodes N1 and N2 tokens of the built-in
pair under valgrind's cachegrind, and (count(N2) − count(N1)) / (N2 − N1) is
one step's instructions, start-up and prefill cancelled out. The auto arm is
held in plain-only mode by a cost table where even a fully accepted block
loses, with the real clock (so its online correction runs as in a real run).
Needs valgrind (Debian's package); several minutes.
"""

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def fib(n):"


def decode(arm: str, n: int) -> None:
    """One run (inside valgrind): `n` tokens of the built-in pair, `--ar` or plain-only auto."""
    import resource

    setrlimit = resource.setrlimit

    def tolerant(*a):  # mlx-lm raises the open-file limit at import; valgrind keeps the hard limit lower
        try:
            setrlimit(*a)
        except ValueError:
            pass

    resource.setrlimit = tolerant
    sys.path.insert(0, str(ROOT))
    from dflash2_mlx import load_pair
    from dflash2_mlx.engine.adaptive.policy import AcceptanceEstimate, BlockPolicy, CostTable
    from dflash2_mlx.engine.decode.loop import generate_step

    pair, tokenizer = load_pair("builtin", "builtin")
    ids = tokenizer.encode(PROMPT)
    if arm == "ar":
        steps = generate_step(ids, pair.without_drafter(), max_tokens=n)
    else:
        losing = CostTable(1.0, {B: B + 0.5 for B in (2, 4, 8, 16)}, {B: 0.0 for B in (2, 4, 8, 16)})
        policy = BlockPolicy(losing, pair.max_block_size, AcceptanceEstimate(pair.max_block_size - 1),
                             clock=time.perf_counter)
        steps = generate_step(ids, pair, max_tokens=n, policy=policy)
    assert sum(len(s.tokens) for s in steps) == n


def instructions(arm: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                        sys.executable, __file__, "--decode", arm, str(n)], check=True, capture_output=True)
        return int(re.search(r"^summary: (\d+)", out.read_text(), re.M).group(1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs=2, default=(30, 130), metavar=("N1", "N2"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--decode", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.decode:
        return decode(args.decode[0], int(args.decode[1]))
    sys.path.insert(0, str(ROOT))
    from dflash2_mlx.device import backend_name
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    n1, n2 = args.tokens
    counts = {arm: {n: instructions(arm, n) for n in (n1, n2)} for arm in ("ar", "auto")}
    per_step = {arm: (c[n2] - c[n1]) / (n2 - n1) for arm, c in counts.items()}
    ratio = per_step["auto"] / per_step["ar"]
    print(f"instructions per step: --ar {per_step['ar'] / 1e6:.2f} M, auto (plain-only) "
          f"{per_step['auto'] / 1e6:.2f} M: {ratio:.4f}x")
    if args.json:
        record = {**provenance(command_line("python benchmarks/plain_step_instructions.py",
                                            sys.argv[1:] if argv is None else argv)),
                  "backend": backend_name(), "machine": platform.machine(), "prompt": PROMPT,
                  "tokens": [n1, n2], "instructions": {a: {str(n): c for n, c in cs.items()} for a, cs in counts.items()},
                  "instructions_per_step": per_step, "auto_over_ar": ratio}
        atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
