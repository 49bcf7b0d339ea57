"""One benchmark, two revisions of the package, in one run: is a change speed-neutral?

    git worktree add /tmp/before <commit>
    python3 -m venv /tmp/before-venv
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/before-venv/lib/python3.11/site-packages/deps.pth
    /tmp/before-venv/bin/pip install --no-deps -e /tmp/before
    python benchmarks/revisions/speed.py --rounds 2 \
        --before /tmp/before-venv/bin/python /tmp/before benchmarks/auto_vs_ar.py \
        --after .venv/bin/python . benchmarks/adaptive/auto_vs_ar.py \
        --json benchmarks/results/revisions-auto-vs-ar-cpu.json -- --repeats 3 --max-tokens 200

Each round runs the benchmark once per revision (its own Python, checkout and script path,
then `--json <tmp>` and the arguments after `--`), the order swapped every other round, one
at a time (never beside each other: they would share the cores). The JSON keeps every run's
record and, for the benchmarks it knows (auto_vs_ar.py, serve.py), a summary per revision:
the median over rounds of each prompt's (or client count's) decode tokens/s per arm, and
after / before. Pause anything else on the machine while it runs.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402

REVISIONS = ("before", "after")


def run_once(python: str, checkout: str, script: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        tic = time.perf_counter()
        done = subprocess.run([python, script, *extra, "--json", str(out)], cwd=checkout, capture_output=True,
                              text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SystemExit(f"{script} in {checkout} failed ({done.returncode}): {' | '.join(tail)}")
        record = json.loads(out.read_text())
        record["wall_s"] = time.perf_counter() - tic
        return record


def decode_rates(record: dict) -> dict:
    """{(what, arm): decode tokens/s} of one record, for the benchmarks this knows."""
    if "prompts" in record:  # auto_vs_ar.py
        return {(prompt, arm): tps for prompt, p in record["prompts"].items()
                for arm, tps in p["decode_tps_median"].items()}
    if "arms" in record:  # serve.py: aggregate tokens/s per arm and client count
        return {(f"{r['clients']} clients", a["arm"]): r["tokens_per_s"] for a in record["arms"] for r in a["runs"]}
    return {}


def summary(rounds: list[dict]) -> list[dict]:
    rows = {}
    for rnd in rounds:
        for rev in REVISIONS:
            for key, tps in decode_rates(rnd[rev]).items():
                rows.setdefault(key, {r: [] for r in REVISIONS})[rev].append(tps)
    out = []
    for (what, arm), by in rows.items():
        before, after = (statistics.median(by[r]) if by[r] else None for r in REVISIONS)
        out.append({"what": what, "arm": arm, "before_tps": before, "after_tps": after,
                    "after_over_before": after / before if before and after else None,
                    "before_runs": by["before"], "after_runs": by["after"]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs=3, required=True, metavar=("PYTHON", "CHECKOUT", "SCRIPT"))
    ap.add_argument("--after", nargs=3, required=True, metavar=("PYTHON", "CHECKOUT", "SCRIPT"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("extra", nargs="*", help="after --: the benchmark's own arguments")
    args = ap.parse_args(argv)
    arms = {"before": args.before, "after": args.after}
    record = {"benchmark": "revisions", **provenance(command_line(Path(sys.executable).name, sys.argv)),
              "before": args.before, "after": args.after, "arguments": args.extra, "rounds": []}
    for i in range(args.rounds):
        order = REVISIONS if i % 2 == 0 else REVISIONS[::-1]
        rnd = {"order": list(order)}
        for rev in order:
            python, checkout, script = arms[rev]
            print(f"round {i + 1}/{args.rounds}: {rev}", file=sys.stderr, flush=True)
            rnd[rev] = run_once(python, checkout, script, args.extra)
        record["rounds"].append(rnd)
        record["summary"] = summary(record["rounds"])
        atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")  # each round kept as it ends
    for row in record["summary"]:
        ratio = row["after_over_before"]
        print(f"{row['what'][:40]!r:44} {row['arm']:11} before {row['before_tps']:7.1f}  after {row['after_tps']:7.1f}"
              f"  x{ratio:.3f}" if ratio else f"{row['what']} {row['arm']}: missing")


if __name__ == "__main__":
    main()
