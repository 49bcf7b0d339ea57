"""τ of the SmolLM2 drafters on held-out requests: DFlash 2 against the DFlash baseline.

    eval "$(bash recipes/blas_shim/build.sh)"   # float matmuls through OpenBLAS: τ, not timing
    python benchmarks/real_pair_tau.py run --drafter smollm2 --part OUT-a.json &
    python benchmarks/real_pair_tau.py run --drafter smollm2-dflash --part OUT-b.json; wait
    python benchmarks/real_pair_tau.py merge OUT-a.json OUT-b.json --out docs/results/smollm2-tau-cpu

Prompts: the recipe's held-out requests (recipes/smollm2_drafters/prompts.py:
topics and tasks that no training prompt uses), the first --per-family of each
family (code, chat, maths), through the chat template. For each drafter, T = 0
and T = 1, chains of block 8 and 16 and the tree of 8 rows: one run per
prompt; τ = tokens committed per target pass after the prefill. At T = 0 every
run is compared with plain greedy decoding of the same target (and, with
--greedy-blocks, chains of more block sizes and trees on the first prompts).
The target is the GGUF's weights dequantized to float32 (train/setup.py's
float_weights): the same function, and on a CPU the fast one; τ is a property
of the pair, not of the kernels. One part per drafter, so two processes share
the work; `merge` writes OUT.json, OUT.md and the plot OUT-tau.{png,svg,json}.
"""

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "recipes" / "smollm2_drafters"))

import mlx.core as mx  # noqa: E402

import prompts as recipe_prompts  # noqa: E402  (the recipe's held-out requests)
from tree_tau import decode, summarize  # noqa: E402  (one speculative run and its τ)
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.decode.loop import autoregressive_generate_step  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.loading.load_pair import load_pair  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.train.setup import float_weights  # noqa: E402

SETTINGS = [("chain", 8), ("chain", 16), ("tree", 8)]


def heldout_prompts(tokenizer, per_family: int) -> list[dict]:
    rows = recipe_prompts.build(12, 0, heldout=True)  # what prompts.py writes as heldout.jsonl
    out, count = [], {}
    for r in rows:
        family = r["source"].split(":")[0]
        if count.get(family, 0) < per_family:
            count[family] = count.get(family, 0) + 1
            text = tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                                 add_generation_prompt=True, tokenize=False)
            out.append({"family": family, "prompt": r["prompt"], "ids": tokenizer.encode(text, add_special_tokens=False)})
    return out


def greedy(pair, ids, max_tokens):
    return [s.tokens[0] for s in autoregressive_generate_step(ids, pair.without_drafter(), max_tokens=max_tokens)]


def run(args):
    from cli.model_source import model_folder  # a named source or .gguf, fetched/converted as --model does

    pair, tokenizer = load_pair(str(model_folder(args.model)), args.drafter, activation_dtype=mx.float32)
    float_weights(pair.target)
    prompts = heldout_prompts(tokenizer, args.per_family)
    ar = [greedy(pair, p["ids"], args.max_tokens) for p in prompts]
    results, checks = [], []
    for T in (0.0, 1.0):
        for method, rows in SETTINGS:
            runs = [decode(pair, p["ids"], rows=rows, tree=method == "tree", temperature=T, seed=i,
                           max_tokens=args.max_tokens) for i, p in enumerate(prompts)]
            for r, p in zip(runs, prompts):
                r["family"] = p["family"]
            if T == 0:
                checks.append({"method": method, "rows": rows, "identical": sum(r["tokens"] == a for r, a in zip(runs, ar)),
                               "of": len(runs)})
            results.append({"temperature": T, "method": method, "rows": rows, **summarize(runs),
                            "by_family": {f: summarize([r for r in runs if r["family"] == f])["tau_mean_over_prompts"]
                                          for f in dict.fromkeys(p["family"] for p in prompts)},
                            "runs": [{k: r[k] for k in ("family", "tau", "passes", "committed")} for r in runs]})
            print(f"{args.drafter} T={T:g} {method} {rows}: τ {results[-1]['tau_mean_over_prompts']:.3f}", flush=True)
    first = prompts[: args.greedy_prompts]
    for method, rows in [("chain", b) for b in args.greedy_blocks] + [("tree", t) for t in args.greedy_trees]:
        runs = [decode(pair, p["ids"], rows=rows, tree=method == "tree", temperature=0.0, seed=0,
                       max_tokens=args.max_tokens) for p in first]
        checks.append({"method": method, "rows": rows, "identical": sum(r["tokens"] == a for r, a in zip(runs, ar)),
                       "of": len(runs)})
    record = {**provenance(command_line("python", sys.argv)), "backend": backend_name(), "mlx": mx.__version__,
              "machine": platform.processor() or platform.machine(), "drafter": str(args.drafter),
              "kind": "dflash2" if pair.drafter.is_dflash2 else "dflash", "model": str(args.model),
              "prompts": len(prompts), "max_tokens": args.max_tokens, "results": results, "greedy_checks": checks}
    atomic_write_text(args.part, json.dumps(record, indent=1) + "\n")


def merge(args):
    parts = {p["kind"]: p for p in (json.loads(Path(f).read_text()) for f in args.parts)}
    new, base = parts["dflash2"], parts["dflash"]
    table = []
    for a, b in zip(new["results"], base["results"]):
        assert (a["temperature"], a["method"], a["rows"]) == (b["temperature"], b["method"], b["rows"])
        table.append({"temperature": a["temperature"], "method": a["method"], "rows": a["rows"],
                      "dflash2_tau": a["tau_mean_over_prompts"], "dflash_tau": b["tau_mean_over_prompts"],
                      "ratio": a["tau_mean_over_prompts"] / b["tau_mean_over_prompts"],
                      "dflash2_by_family": a["by_family"], "dflash_by_family": b["by_family"]})
    record = {**provenance(command_line("python", sys.argv)), "backend": new["backend"], "machine": new["machine"],
              "mlx": new["mlx"], "model": new["model"], "prompts": new["prompts"], "max_tokens": new["max_tokens"],
              "table": table, "parts": parts}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(record))
    plot(record, out.with_name(out.name + "-tau"))
    print(markdown(record))


def markdown(record: dict) -> str:
    lines = [f"# τ of the SmolLM2-135M-Instruct drafters on {record['prompts']} held-out requests", "",
             f"Backend {record['backend']} ({record['machine']}), mlx {record['mlx']}; max {record['max_tokens']} "
             "tokens, one run per prompt and setting; τ = tokens committed per target pass (mean over prompts).",
             f"Parts: " + "; ".join(f"`{p['command']}`" for p in record["parts"].values()),
             f"Merged by `{record['command']}` at commit {record.get('commit') or 'unknown'}.", "",
             "| T | setting | DFlash 2 τ | DFlash τ | DFlash 2 / DFlash |", "|---|---|---|---|---|"]
    for r in record["table"]:
        lines.append(f"| {r['temperature']:g} | {r['method']} {r['rows']} | {r['dflash2_tau']:.3f} | "
                     f"{r['dflash_tau']:.3f} | {r['ratio']:.3f}x |")
    lines += ["", "Greedy runs identical to plain greedy decoding of the same target:", ""]
    for kind, part in record["parts"].items():
        lines.append(f"- {kind}: " + ", ".join(f"{c['method']} {c['rows']}: {c['identical']}/{c['of']}"
                                             for c in part["greedy_checks"]))
    return "\n".join(lines) + "\n"


def plot(record: dict, stem: Path) -> None:
    from dflash2_mlx.tools.plots import _write

    labels = [f"T={r['temperature']:g}\n{r['method']} {r['rows']}" for r in record["table"]]

    def draw(ax):
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], [r["dflash_tau"] for r in record["table"]], 0.4, label="DFlash (baseline)")
        ax.bar([x + 0.2 for x in xs], [r["dflash2_tau"] for r in record["table"]], 0.4, label="DFlash 2")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("τ (tokens per target pass)")
        ax.legend()

    _write(stem, "SmolLM2-135M-Instruct: τ on held-out requests", f"backend {record['backend']} · mlx {record['mlx']}\n"
           f"{record['command']}", {"table": record["table"]}, draw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="smollm2", help="the target, as --model takes it")
    r.add_argument("--drafter", required=True, help="a drafter folder or shipped name (smollm2, smollm2-dflash)")
    r.add_argument("--part", type=Path, required=True)
    r.add_argument("--per-family", type=int, default=7)
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--greedy-prompts", type=int, default=3)
    r.add_argument("--greedy-blocks", type=int, nargs="*", default=[2, 3, 4, 6, 12])
    r.add_argument("--greedy-trees", type=int, nargs="*", default=[16])
    m = sub.add_parser("merge")
    m.add_argument("parts", nargs=2)
    m.add_argument("--out", required=True)
    args = ap.parse_args()
    run(args) if args.cmd == "run" else merge(args)


if __name__ == "__main__":
    main()
