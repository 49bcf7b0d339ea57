"""τ of tree verification against the chain at the same verify rows, on the built-in pair.

    python benchmarks/acceptance/tree_tau.py --out benchmarks/results/tree-tau-builtin-cpu

Held-out prompts: runs of lines from the built-in target's held-out stdlib
modules (the split of recipes/builtin_target/corpus.py), the last 96 tokens,
as the drafters' data recipe cuts them. With --bench-suites, the prompts of
`dflash2 bench`'s suites (tools/suites.py, as bench renders them) run in the
same run, each set reported on its own (τ by set). For every prompt, T = 0 and T = 1 and
every N in --rows, one run each of: the chain with block size N (N rows per
target pass) and the tree of N rows (drafted from the drafter's full block).
Then the first prompt's cycle broken down by phase (timed profiler: it adds a
sync per phase, so these times are for attribution, not throughput) for the
chain and the tree at every N. Writes OUT.json and OUT.md with this command.
"""

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes" / "builtin_target"))
sys.path.insert(0, str(ROOT))

import corpus  # noqa: E402  (the built-in target's train / held-out split)
import mlx.core as mx  # noqa: E402

from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.decode.loop import generate_step  # noqa: E402
from dflash2_mlx.engine.decode.profile import CycleProfiler  # noqa: E402
from dflash2_mlx.engine.plan import plan  # noqa: E402
from dflash2_mlx.engine.request import DecodeRequest  # noqa: E402
from dflash2_mlx.engine.sampling import SamplingParams  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.loading.load_pair import load_pair  # noqa: E402
from dflash2_mlx.text.prompt import build_prompt  # noqa: E402
from dflash2_mlx.tools.suites import builtin_prompts  # noqa: E402


def heldout_prompts(tokenizer, n: int, lines: int, seed: int, tokens: int = 96) -> list[list[int]]:
    split = corpus.collect()
    root, files = Path(split["root"]), sorted(split["heldout"])
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        text = (root / rng.choice(files)).read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if len(text) < lines + 4:
            continue
        start = rng.randrange(0, len(text) - lines)
        chunk = "".join(text[start : start + lines])
        if chunk.strip():
            out.append(tokenizer.encode(chunk)[-tokens:])
    return out


def decode_steps(prompt, pair, request: DecodeRequest, profiler=None, prompt_cache=None):
    """The decode loop on `pair` for `request`'s plan (`prompt` continues `prompt_cache`'s tokens, if given)."""
    history = max(len(prompt_cache.tokens) - 1, 0) if prompt_cache is not None else 0
    decode = plan(pair, request, prompt_ids=prompt, history=history)
    return generate_step(prompt, pair, decode, prompt_cache=prompt_cache, profiler=profiler)


def decode(pair, prompt, *, rows, tree, temperature, seed, max_tokens, profiler=None):
    sampling = SamplingParams(temperature=temperature, seed=seed)
    # The tree drafts the drafter's fixed block (block_size None); the chain drafts N rows.
    kw = dict(block_size=None, tree_rows=rows) if tree else dict(block_size=rows)
    t0 = time.perf_counter()
    steps = list(decode_steps(prompt, pair, DecodeRequest(max_tokens=max_tokens, sampling=sampling, **kw), profiler))
    seconds = time.perf_counter() - t0
    passes = steps[1:]
    committed = sum(len(s.tokens) for s in passes)
    return {"passes": len(passes), "committed": committed, "tau": committed / max(len(passes), 1),
            "verify_rows": sum(s.verify_rows for s in passes), "seconds": seconds,
            "depth_accepted": [s.accepted for s in passes], "tokens": [t for s in steps for t in s.tokens]}


def summarize(runs: list[dict]) -> dict:
    taus = [r["tau"] for r in runs]
    passes = sum(r["passes"] for r in runs)
    committed = sum(r["committed"] for r in runs)
    return {"tau_mean_over_prompts": sum(taus) / len(taus), "tau_pooled": committed / passes,
            "passes": passes, "committed": committed,
            "tau_per_verify_row": committed / sum(r["verify_rows"] for r in runs)}


def cycle_breakdown(pair, prompt, rows, tree, max_tokens) -> dict:
    profiler = CycleProfiler(timed=True)
    rec = decode(pair, prompt, rows=rows, tree=tree, temperature=0.0, seed=0, max_tokens=max_tokens,
                 profiler=profiler)
    ms = {k: 1000 * v / rec["passes"] for k, v in profiler.seconds.items()}
    return {"passes": rec["passes"], "ms_per_cycle_by_phase": ms, "ms_per_cycle": sum(ms.values()),
            "host_syncs_per_cycle": profiler.fetches / rec["passes"]}


def cycle_breakdowns(pair, prompt, rows: list[int], max_tokens: int, rounds: int) -> list[dict]:
    """Chain and tree at every N, alternating over `rounds` (other work on the
    machine shifts single runs); per phase the median over rounds."""
    configs = [(m, N) for N in rows for m in ("chain", "tree")]
    runs = {c: [] for c in configs}
    for r in range(rounds):
        for m, N in (configs if r % 2 == 0 else configs[::-1]):
            runs[(m, N)].append(cycle_breakdown(pair, prompt, N, m == "tree", max_tokens))
    out = []
    for (m, N), recs in runs.items():
        phases = list(dict.fromkeys(p for rec in recs for p in rec["ms_per_cycle_by_phase"]))
        ms = {p: statistics.median(rec["ms_per_cycle_by_phase"].get(p, 0.0) for rec in recs) for p in phases}
        out.append({"method": m, "rows": N, "rounds": rounds, "passes": recs[0]["passes"],
                    "ms_per_cycle_by_phase": ms, "ms_per_cycle": sum(ms.values()),
                    "ms_per_cycle_rounds": [rec["ms_per_cycle"] for rec in recs],
                    "host_syncs_per_cycle": recs[0]["host_syncs_per_cycle"]})
    return out


def sets_line(record: dict) -> str:
    sets = record.get("prompt_sets") or ["heldout"] * record["prompts"]
    return ", ".join(f"{n} {sets.count(n)}" for n in dict.fromkeys(sets))


def markdown(record: dict) -> str:
    lines = [f"# Tree vs chain at the same verify rows: {record['drafter']} on the built-in target", "",
             f"Command: `{record['command']}` at commit {record.get('commit') or 'unknown'}", "",
             f"Backend {record['backend']} ({record['machine']}), mlx {record['mlx']}; {record['prompts']} "
             f"prompts ({sets_line(record)}), max {record['max_tokens']} tokens, one run per prompt and setting. τ = tokens committed per "
             "target pass after the prefill (mean over prompts; pooled in the JSON).", "",
             "| T | rows N | chain τ (block N) | tree τ (N rows) | tree / chain | chain τ per row | tree τ per row |",
             "|---|---|---|---|---|---|---|"]
    for row in record["comparison"]:
        lines.append(f"| {row['temperature']:g} | {row['rows']} | {row['chain']['tau_mean_over_prompts']:.3f} | "
                     f"{row['tree']['tau_mean_over_prompts']:.3f} | {row['ratio']:.3f}x | "
                     f"{row['chain']['tau_per_verify_row']:.3f} | {row['tree']['tau_per_verify_row']:.3f} |")
    names = list(dict.fromkeys(record.get("prompt_sets", [])))
    if len(names) > 1:
        lines += ["", "By set (τ mean over the set's prompts, chain / tree):", "",
                  "| T | rows N | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for row in record["comparison"]:
            lines.append(f"| {row['temperature']:g} | {row['rows']} | " + " | ".join(
                f"{row['chain']['by_set'][n]:.3f} / {row['tree']['by_set'][n]:.3f}" for n in names) + " |")
    lines += ["", f"Greedy output identical to autoregressive decoding: {record['greedy_identical_to_ar']}.", "",
              f"## Cycle breakdown (first prompt, T = 0, timed profiler, ms per cycle, median of "
             f"{record['cycles'][0]['rounds']} alternating rounds)", "",
             "Phases: draft (drafter forward), select (chain: the selector walk), build (tree: lattice scores, "
             "one fetch, best-first search), mask (tree: gather indices and masks), verify (target pass), "
             "accept (walk and the host fetch), commit (tree: the accepted rows written into the caches; the "
             "chain's rollback, an offset trim, is not a timed phase).", "",
              "| method | rows | " + " | ".join(record["phases"]) + " | total | host syncs / cycle |",
              "|---|---|" + "---|" * (len(record["phases"]) + 2)]
    for c in record["cycles"]:
        ms = c["ms_per_cycle_by_phase"]
        lines.append(f"| {c['method']} | {c['rows']} | " + " | ".join(f"{ms.get(p, 0.0):.2f}" for p in record["phases"])
                     + f" | {c['ms_per_cycle']:.2f} | {c['host_syncs_per_cycle']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="path without suffix: writes OUT.json and OUT.md")
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--prompt-lines", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--drafter", default="builtin")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cycle-rounds", type=int, default=5)
    ap.add_argument("--bench-suites", nargs="*", default=[], help="also the prompts of these bench suites "
                    "(code chat maths), in the same run")
    args = ap.parse_args()

    pair, tokenizer = load_pair("builtin", args.drafter, activation_dtype=mx.float32)
    prompts = heldout_prompts(tokenizer, args.prompts, args.prompt_lines, args.seed)
    sets = ["heldout"] * len(prompts)
    for p in builtin_prompts(args.bench_suites):
        prompts.append(build_prompt(tokenizer, p.text))
        sets.append(p.suite)
    plain = pair.without_drafter()
    ar = [[s.tokens[0] for s in decode_steps(p, plain, DecodeRequest(max_tokens=args.max_tokens, block_size=None))]
          for p in prompts]
    comparison, identical, total = [], 0, 0
    for T in (0.0, 1.0):
        for N in args.rows:
            row = {"temperature": T, "rows": N}
            for method in ("chain", "tree"):
                runs = [decode(pair, p, rows=N, tree=method == "tree", temperature=T, seed=i,
                               max_tokens=args.max_tokens) for i, p in enumerate(prompts)]
                if T == 0:
                    identical += sum(r["tokens"] == a for r, a in zip(runs, ar))
                    total += len(runs)
                by_set = {n: summarize([r for r, m in zip(runs, sets) if m == n])["tau_mean_over_prompts"]
                          for n in dict.fromkeys(sets)}
                row[method] = {**summarize(runs), "by_set": by_set, "runs": runs}
            row["ratio"] = row["tree"]["tau_mean_over_prompts"] / row["chain"]["tau_mean_over_prompts"]
            comparison.append(row)
            print(f"T={T:g} N={N}: chain τ {row['chain']['tau_mean_over_prompts']:.3f}  "
                  f"tree τ {row['tree']['tau_mean_over_prompts']:.3f}  ({row['ratio']:.3f}x); by set "
                  + ", ".join(f"{n} {row['chain']['by_set'][n]:.3f}/{row['tree']['by_set'][n]:.3f}"
                              for n in row["chain"]["by_set"]), flush=True)
    cycles = cycle_breakdowns(pair, prompts[0], args.rows, args.max_tokens, args.cycle_rounds)
    phases = list(dict.fromkeys(p for c in cycles for p in c["ms_per_cycle_by_phase"]))
    record = {
        **provenance(command_line("python", sys.argv)), "backend": backend_name(), "mlx": mx.__version__,
        "machine": platform.processor() or platform.machine(), "drafter": args.drafter,
        "prompts": len(prompts), "max_tokens": args.max_tokens, "prompt_ids": prompts, "prompt_sets": sets,
        "greedy_identical_to_ar": f"{identical}/{total}", "comparison": comparison,
        "phases": phases, "cycles": cycles,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
