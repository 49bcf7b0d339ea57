"""Sampled speculation on the real pair draws from SmolLM2's own distribution: a chi-square test.

    eval "$(bash recipes/blas_shim/build.sh)"   # float matmuls through OpenBLAS: samples, not timing
    python benchmarks/acceptance/real_pair_sampling.py --samples 2000 --json benchmarks/results/smollm2-sampling-cpu.json

For each held-out request (recipes/smollm2_drafters/prompts.py, through the chat template) and each
setting (a DFlash 2 chain of 8 rows and the tree of 8), `--samples` seeded runs at T = 1 decode the
first three tokens: the first comes from the prompt's pass, the next two from the first speculative
cycle (3 rows: a chain never drafts past the tokens wanted; drafted tokens accepted, a residual
sampled after a rejection, or the bonus after both were accepted). Their counts are tested against
the target's exact joint distribution p(a) p(b | a) p(c | a, b), computed here from the target's own
forward passes in float64 (no engine code): a cell for every (a, b, c) expected to hold at least 5
samples, and one cell for everything else, whose probability is exactly what the kept cells leave.
A drafter's proposals accepted as if they were the target's would skew the second and third tokens;
the run records how many drafted tokens were accepted, so both branches of the rule are seen. Large
p-values are what lossless sampling gives; the JSON keeps every count.

The target is the GGUF's weights dequantized to float32 (train/setup.py's float_weights), as in
benchmarks/acceptance/real_pair_tau.py: the same function, the fast one on a CPU.
"""

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "acceptance"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from scipy.stats import chisquare  # noqa: E402

from real_pair_tau import prompt_set, with_ids  # noqa: E402
from tree_tau import decode_steps  # noqa: E402  (the decode loop on a request's plan)
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.request import DecodeRequest  # noqa: E402
from dflash2_mlx.engine.sampling import SamplingParams  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.loading.load_pair import load_pair  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.train.setup import float_weights  # noqa: E402

SETTINGS = [("chain", 8), ("tree", 8)]
TOKENS = 3  # the prompt's token, then one cycle of (at most) 3 rows: two drafts and the bonus
MIN_EXPECTED = 5.0


def next_token_probs(model, ids: list[int]) -> np.ndarray:
    """softmax of the target's last logits, in float64: T = 1 with no filter."""
    logits = np.array(model(mx.array([ids]))[0, -1].astype(mx.float32), dtype=np.float64)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def exact_cells(model, ids: list[int], samples: int, depth: int = 3) -> dict:
    """{tokens: probability} for every sequence of `depth` first tokens expected to hold
    MIN_EXPECTED samples (a prefix below the bar has no continuation above it)."""
    cells = {}

    def walk(prefix: tuple, p_prefix: float):
        p = p_prefix * next_token_probs(model, ids + list(prefix))
        for t in np.flatnonzero(p * samples >= MIN_EXPECTED):
            if len(prefix) + 1 == depth:
                cells[prefix + (int(t),)] = float(p[t])
            else:
                walk(prefix + (int(t),), float(p[t]))

    walk((), 1.0)
    return cells


def sample(pair, ids, method: str, rows: int, samples: int) -> tuple[dict, int, int]:
    """Counts of the first TOKENS tokens over seeds 0..samples-1, and drafted / accepted in the first cycle.
    The prompt but its last two tokens is prefilled once, into a cache every sample continues and
    is truncated back to (the server's multi-turn path), so a sample runs two prompt rows and one cycle."""
    from dflash2_mlx.engine.decode.state import DecodeCache

    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    list(decode_steps(ids[:-1], pair, DecodeRequest(max_tokens=1, block_size=None), prompt_cache=cache))
    rest = len(ids) - 1
    cache.truncate(rest)  # at rest: ids[:-1] committed, ids[-2] not yet run
    counts, drafted, accepted = {}, 0, 0
    kw = dict(block_size=None, tree_rows=rows) if method == "tree" else dict(block_size=rows)
    for seed in range(samples):
        request = DecodeRequest(max_tokens=TOKENS, sampling=SamplingParams(1.0, seed=seed), **kw)
        steps = list(decode_steps(ids[-2:], pair, request, prompt_cache=cache))
        cache.truncate(rest)
        tokens = tuple(t for s in steps for t in s.tokens)[:TOKENS]
        counts[tokens] = counts.get(tokens, 0) + 1
        drafted += steps[1].drafted
        accepted += steps[1].accepted
    return counts, drafted, accepted


def test(cells: dict, counts: dict, samples: int) -> dict:
    keys = sorted(cells, key=lambda k: -cells[k])
    expected = [cells[k] * samples for k in keys] + [(1.0 - sum(cells.values())) * samples]
    observed = [counts.get(k, 0) for k in keys] + [samples - sum(counts.get(k, 0) for k in keys)]
    result = chisquare(observed, expected)
    return {"cells": len(expected), "chi2": float(result.statistic), "p_value": float(result.pvalue),
            "observed": observed, "expected": expected, "pairs": [list(k) for k in keys]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--drafter", default="smollm2")
    ap.add_argument("--prompts", type=int, default=2, help="held-out requests (the first of each family, in turn)")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    from cli.model_source import model_folder  # a named source or .gguf, fetched/converted as --model does

    pair, tokenizer = load_pair(str(model_folder(args.model)), args.drafter, activation_dtype=mx.float32)
    float_weights(pair.target)
    prompts = with_ids(prompt_set("templated", 1), tokenizer)[: args.prompts]
    results = []
    for p in prompts:
        cells = exact_cells(pair.target.model, p["ids"], args.samples, TOKENS)
        for method, rows in SETTINGS:
            counts, drafted, accepted = sample(pair, p["ids"], method, rows, args.samples)
            r = {"prompt": p["prompt"], "family": p["family"], "method": method, "rows": rows,
                 "samples": args.samples, "drafted_in_first_cycles": drafted, "accepted_in_first_cycles": accepted,
                 **test(cells, counts, args.samples)}
            print(f"{p['family']:6} {method} {rows:2}: p = {r['p_value']:.3f} over {r['cells']} cells, "
                  f"{accepted} of {drafted} drafted tokens accepted", flush=True)
            results.append(r)
    out = {**provenance(command_line("python", sys.argv)), "benchmark": "real_pair_sampling",
           "backend": backend_name(), "mlx": mx.__version__, "machine": platform.machine(),
           "target_weights": "float32 (dequantized GGUF)",
           "temperature": 1.0, "results": results}
    atomic_write_text(args.json, json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
