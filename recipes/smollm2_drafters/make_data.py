"""SmolLM2's own answers to the recipe's prompts: the drafters' training data.

    python recipes/smollm2_drafters/make_data.py PROMPTS.jsonl OUT.jsonl [--shard I --shards N]

Drafters must learn the target's own distribution (verification accepts
against it: docs/algorithm.md §6), so each request goes through the chat
template and is answered by the target: two chunks in three greedily (what
T = 0 serving sees) and one in three sampled at T = 1 (the distribution
itself). The target runs on float32 weights dequantized from the GGUF: the same
function, and the CPU's float matmuls are the fast ones (BLAS shim). Appends
chunk by chunk to OUT.partial and resumes there; OUT appears when complete.
Rows are {"prompt": templated request, "response": answer, "source", "temperature"}.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash2_mlx.loading.checkpoints import load_target  # noqa: E402
from cli.model_source import model_folder  # noqa: E402  (fetch + convert, as --model does)


def float_target(ref: str):
    from mlx_lm.utils import dequantize_model

    target, tokenizer = load_target(str(model_folder(ref)), activation_dtype=mx.float32)
    model = dequantize_model(target.model)
    model.set_dtype(mx.float32)
    return model, tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompts", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="the first this many prompts of the shard (0: all)")
    args = ap.parse_args()
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    rows = rows[args.shard :: args.shards]
    rows = rows[: args.limit] if args.limit else rows
    partial = args.out.with_suffix(".partial")
    done = len(partial.read_text().splitlines()) if partial.exists() else 0
    model, tokenizer = float_target(args.model)
    tic, made = time.time(), 0
    with partial.open("a") as fh:
        for start in range(done - done % args.batch, len(rows), args.batch):
            chunk = rows[start : start + args.batch]
            index = start // args.batch
            temp = 1.0 if index % 3 == 2 else 0.0
            mx.random.seed(args.seed * 1000 + args.shard * 100_000 + index)
            prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                                     add_generation_prompt=True, tokenize=False) for r in chunk]
            ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
            res = batch_generate(model, tokenizer, ids, max_tokens=args.max_tokens, sampler=make_sampler(temp=temp))
            for r, p, text in zip(chunk, prompts, res.texts):
                fh.write(json.dumps({"prompt": p, "response": text, "source": r["source"], "temperature": temp}) + "\n")
            fh.flush()
            made += sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in res.texts)
            print(f"{min(start + args.batch, len(rows))}/{len(rows)} prompts, {made / (time.time() - tic):.0f} tokens/s",
                  file=sys.stderr, flush=True)
    partial.replace(args.out)


if __name__ == "__main__":
    main()
