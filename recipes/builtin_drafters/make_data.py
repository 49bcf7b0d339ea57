"""Prompts from the stdlib corpus, completed by the built-in target itself.

    python recipes/builtin_drafters/make_data.py OUT_DIR [--shard I --shards N]

Drafters must learn the target's own distribution (verification accepts
against it: docs/algorithm.md §6), so each prompt
(a run of lines from a stdlib file) is continued by the target, sampled at
T=1, and stored as JSONL {"prompt", "response"}. Train prompts come from the
target's training modules, held-out prompts from its held-out modules (the
same split as recipes/builtin_target/corpus.py). Shards let two processes
share the work.
"""

import argparse
import json
import random
import sys
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes" / "builtin_target"))
sys.path.insert(0, str(ROOT))

import corpus  # noqa: E402  (the target recipe's file selection and held-out rule)
from dflash2_mlx.loading.builtin import BUILTIN_DIR  # noqa: E402
from dflash2_mlx.loading.checkpoints import load_target  # noqa: E402


def prompts_from(files, rng, per_file: int, prompt_lines: int):
    out = []
    for f in files:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if len(lines) < prompt_lines + 4:
            continue
        for _ in range(per_file):
            start = rng.randrange(0, len(lines) - prompt_lines)
            text = "".join(lines[start : start + prompt_lines])
            if text.strip():
                out.append({"prompt": text, "source": str(f.relative_to(corpus.stdlib_root()))})
    return out


def complete(target, tokenizer, prompts, max_tokens: int, batch: int, seed: int):
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    sampler = make_sampler(temp=1.0)
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        ids = [tokenizer.encode(p["prompt"])[-96:] for p in chunk]
        res = batch_generate(target.model, tokenizer, ids, max_tokens=max_tokens, sampler=sampler)
        for p, ids_p, text in zip(chunk, ids, res.texts):
            yield {"prompt": tokenizer.decode(ids_p), "response": text, "source": p["source"]}
        print(f"{min(i + batch, len(prompts))}/{len(prompts)}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--per-file", type=int, default=4)
    ap.add_argument("--prompt-lines", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=str(BUILTIN_DIR / "target"))
    ap.add_argument("--splits", default="train,heldout", help="which splits to write")
    ap.add_argument("--heldout-per-file", type=int, default=0, help="prompts per held-out file (0: --per-file)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many prompts per split (0: all)")
    args = ap.parse_args()

    target, tokenizer = load_target(args.model, activation_dtype=mx.float32)
    info = corpus.collect()
    root = Path(info["root"])
    rng = random.Random(args.seed)
    for split in ("train", "heldout"):
        chosen = [root / rel for rel in info[split]]
        per_file = args.heldout_per_file if split == "heldout" and args.heldout_per_file else args.per_file
        # Draw a skipped split's prompts too: the other split's draws then do
        # not depend on --splits.
        prompts = prompts_from(chosen, rng, per_file, args.prompt_lines)
        if split not in args.splits.split(","):
            continue
        if args.limit:
            prompts = prompts[: args.limit]
        prompts = prompts[args.shard :: args.shards]
        out = args.out / f"{split}-{args.shard}.jsonl"
        tmp = out.with_suffix(".jsonl.tmp")
        args.out.mkdir(parents=True, exist_ok=True)
        with tmp.open("w") as fh:
            for row in complete(target, tokenizer, prompts, args.max_tokens, args.batch, args.seed + args.shard):
                fh.write(json.dumps(row) + "\n")
        tmp.replace(out)


if __name__ == "__main__":
    main()
