"""Write TRAINING.md for a drafter the recipe trained: command, tokens, time
and held-out numbers, all read from the run folder (nothing typed by hand).

    python recipes/builtin_drafters/training_md.py RUN VARIANT DEST_FOLDER --seq-len 256
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash2_mlx.train.trainer import read_metrics  # noqa: E402


BUILTIN_ABOUT = """Trained by `recipes/builtin_drafters/make.sh` (`dflash2 train --processes 2`: two ring ranks
through mlx.launch, BLAS shim from recipes/blas_shim; CPU backend) against the built-in target,
on prompts from the target's training modules completed by the target at T=1
(`make_data.py --per-file 2`)."""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("variant")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--title", default=None, help="heading (default: 'Built-in VARIANT drafter')")
    ap.add_argument("--about", type=Path, default=None,
                    help="a file with the paragraph on how it was trained (default: the built-in recipe's)")
    args = ap.parse_args()
    folder = args.run / args.variant
    steps, evals = read_metrics(folder, "step"), read_metrics(folder, "eval")
    checkpoint = sorted((folder / "checkpoints").glob("step-*"))[-1]
    cfg = json.loads((checkpoint / "state.json").read_text())["config"]
    tokens_per_step = cfg["batch_size"] * args.seq_len
    seconds = sum(tokens_per_step / r["tokens_per_s"] for r in steps)
    median_tps = sorted(r["tokens_per_s"] for r in steps)[len(steps) // 2]
    last = evals[-1]
    about = args.about.read_text().strip() if args.about else BUILTIN_ABOUT
    lines = [
        f"# {args.title or f'Built-in {args.variant} drafter'}",
        "",
        about,
        "",
        f"- steps: {cfg['steps']} × {cfg['batch_size']} sequences × {args.seq_len} tokens = "
        f"{cfg['steps'] * tokens_per_step:,} training tokens",
        f"- what trained: `--train {cfg['trainable']}`; AdamW lr {cfg['lr']}, warm-up {cfg['warmup']}, cosine; seed {cfg['seed']}",
        f"- training time: {seconds / 60:.1f} min of step time (sum over steps of tokens / measured tokens/s; "
        f"evaluations and checkpoints not included); median {median_tps:,.0f} tokens/s, both ranks together",
        f"- held-out (trainer's split) at step {last['step']}: loss {last['loss']:.3f}; Recall@1 by position "
        + " ".join(f"{x:.2f}" for x in last["recall1_by_position"][:6]) + " …",
        "",
        "| step | held-out loss | Recall@1 pos 0 | pos 1 | pos 2 |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {e['step']} | {e['loss']:.3f} | " + " | ".join(f"{x:.2f}" for x in e["recall1_by_position"][:3]) + " |"
              for e in evals]
    if not args.about:
        lines += ["", "The seed's tables for this drafter and its siblings: benchmarks/results/analyze-builtin/analysis.md."]
    lines.append("")
    (args.dest / "TRAINING.md").write_text("\n".join(lines))
    print(f"wrote {args.dest / 'TRAINING.md'}")


if __name__ == "__main__":
    main()
