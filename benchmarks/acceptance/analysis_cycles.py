"""Re-measure the cycle latency of an analysis' four variants, alone on the machine.

    python benchmarks/acceptance/analysis_cycles.py benchmarks/results/analyze-builtin/analysis.json --run runs/builtin_drafters_v2 \
        --data runs/builtin_drafters_v2/data/heldout-0.jsonl ... (the analysis' --data, same order)

`dflash2 analyze` measures cycle latency in the same run as everything else;
if other work shared the machine during that run, this re-measures only the
latency (variants alternating over rounds, median round; see
dflash2_mlx.tools.analyze.variant_cycles), replaces the cycle records and overheads
in the JSON, re-renders the markdown beside it and records this command in both.
τ and recall are untouched.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx.tools.analyze import heldout_sequences, markdown, relative_to_dflash, variant_cycles  # noqa: E402
from dflash2_mlx.engine.pair import Pair  # noqa: E402
from dflash2_mlx.loading.builtin import resolve_builtin  # noqa: E402
from dflash2_mlx.loading.checkpoints import load_drafter, load_target  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, git_commit  # noqa: E402

FOLDERS = {"dflash": "dflash", "dflash+selector": "dflash-selector", "dflash+conv": "dflash-conv", "dflash2": "dflash2"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("analysis", type=Path)
    ap.add_argument("--run", type=Path, required=True, help="the recipe's run folder (its four drafter/ folders)")
    ap.add_argument("--data", action="append", required=True, help="the analysis' --data files, in order")
    ap.add_argument("--heldout-fraction", type=float, default=1.0)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--model", default="builtin")
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    result = json.loads(args.analysis.read_text())
    import mlx.core as mx

    drafters = {name: load_drafter(str(args.run / FOLDERS[name] / "drafter"), activation_dtype=mx.float32)
                for name in result["variants"]}
    target, tokenizer = load_target(resolve_builtin(args.model, "target"), activation_dtype=mx.float32)
    # The analysis' first decode prompt, rebuilt exactly as `dflash2 analyze` does.
    heldout = heldout_sequences(args.data, tokenizer, args.seq_len, args.heldout_fraction)
    prompt = heldout.tokens[0, : args.prompt_len].tolist()
    if "cycle_prompt" in result and result["cycle_prompt"] != prompt:
        sys.exit("these --data do not rebuild the analysis' prompt: pass its --data in the same order")
    block = result["variants"]["dflash"]["cycle"]["block_size"]
    pairs = {name: Pair.make(target, drafter) for name, drafter in drafters.items()}
    cycles = variant_cycles(pairs, prompt, args.cycles, args.repeats, block)
    for name, record in cycles.items():
        result["variants"][name]["cycle"] = record
    relative_to_dflash(result)
    command = command_line("python", sys.argv)
    result["cycle_command"], result["cycle_commit"] = command, git_commit()
    args.analysis.write_text(json.dumps(result, indent=1) + "\n")
    md = args.analysis.with_suffix(".md")
    first_line = md.read_text().splitlines()[0]
    md.write_text(markdown(result, first_line.removeprefix("Command: `").removesuffix("`"))
                  + f"\nCycle latency re-measured alone on the machine: `{command}` at commit "
                  f"{result['cycle_commit'] or 'unknown'}\n")
    for name, record in cycles.items():
        print(f"{name:<16} {record['cycle_ms_untimed']:7.2f} ms  rounds {[round(x, 1) for x in record['cycle_ms_untimed_rounds']]}")


if __name__ == "__main__":
    main()
