"""Instructions per decoded token for two revisions of the package: is a change speed-neutral?

    python benchmarks/revisions/instructions.py \
        --before /tmp/before-venv/bin/python --after /tmp/after-venv/bin/python \
        --json benchmarks/results/revisions-instructions-cpu.json

Wall-clock decode speed on this project's 2-core virtual machine moves by ±30 % from one
run to the next (benchmarks/results/revisions-auto-vs-ar-cpu.json shows it), far more
than a refactor's cost. Instructions do not move: each revision's Python (its own
checkout installed, see speed.py's header) decodes N1 and N2 tokens of the built-in pair
through `stream_generate`, the user's entry point (text layer, plan, loop, sampling),
under valgrind's cachegrind, and (count(N2) - count(N1)) / (N2 - N1) is one token's
instructions, start-up and prefill cancelled out. Arms: plain decoding (`--ar`), a fixed
chain of 4 and a greedy tree of 8 rows (deterministic: no clock decides anything). Two
runs at a time (counts do not depend on the load). Needs valgrind; about ten minutes.
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ARMS = ("ar", "block4", "tree8")
# Decodes with either revision's API (keywords before the DecodeRequest, the request after).
CHILD = r'''
import inspect, sys
sys.path.insert(0, sys.argv[3])  # this checkout's benchmarks/ (the revision's own package is imported below)
from valgrind import tolerate_rlimits
tolerate_rlimits()
from dflash2_mlx import load_pair, stream_generate
arm, n = sys.argv[1], int(sys.argv[2])
pair, tokenizer = load_pair("builtin", "builtin")
ids = tokenizer.encode("def fib(n):")
settings = dict(max_tokens=n, block_size=None if arm != "block4" else 4, tree_rows=8 if arm == "tree8" else 0)
pair = pair.without_drafter() if arm == "ar" else pair
if "request" in inspect.signature(stream_generate).parameters:
    from dflash2_mlx import DecodeRequest
    out = list(stream_generate(pair, tokenizer, ids, DecodeRequest(**settings)))
else:
    out = list(stream_generate(pair, tokenizer, ids, **settings))
assert len(out) == n, len(out)
'''


def count(python: str, arm: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        child, out = Path(tmp) / "child.py", Path(tmp) / "cg.out"
        child.write_text(CHILD)
        subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                        python, str(child), arm, str(n), str(ROOT / "benchmarks")], check=True, capture_output=True,
                       cwd=tmp)
        return int(re.search(r"^summary: (\d+)", out.read_text(), re.M).group(1))


def main(argv=None):
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the Python of the revision before")
    ap.add_argument("--after", required=True, help="the Python of the revision after")
    ap.add_argument("--tokens", type=int, nargs=2, default=(20, 60), metavar=("N1", "N2"))
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    (n1, n2), pythons = args.tokens, {"before": args.before, "after": args.after}
    jobs = [(rev, arm, n) for arm in ARMS for rev in pythons for n in (n1, n2)]
    with ThreadPoolExecutor(2) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: count(pythons[j[0]], j[1], j[2]), jobs)))
    rows = []
    for arm in ARMS:
        per = {rev: (counts[(rev, arm, n2)] - counts[(rev, arm, n1)]) / (n2 - n1) for rev in pythons}
        rows.append({"arm": arm, "before_per_token": per["before"], "after_per_token": per["after"],
                     "after_over_before": per["after"] / per["before"]})
        print(f"{arm:7} before {per['before'] / 1e6:8.2f} M/token  after {per['after'] / 1e6:8.2f} M/token  "
              f"x{per['after'] / per['before']:.4f}", flush=True)
    record = {"benchmark": "revisions-instructions", **provenance(command_line(Path(sys.executable).name, sys.argv)),
              "before": args.before, "after": args.after, "tokens": [n1, n2],
              "counts": {f"{rev} {arm} {n}": c for (rev, arm, n), c in counts.items()}, "per_token": rows}
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
