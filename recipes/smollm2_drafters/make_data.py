"""SmolLM2's own answers to the corpus's requests: the drafters' training data.

    python recipes/smollm2_drafters/make_data.py MODEL_DIR PROMPTS.jsonl.xz OUT_DIR [--shard I --shards N]
    python recipes/smollm2_drafters/make_data.py MODEL_DIR ANSWERED_DIR OUT_DIR --follow-up 1500

Runs in the recipe's PyTorch environment (make.sh builds it), not the package's:
on this machine's CPUs (AMX) PyTorch's bfloat16 matmuls are the fast path, and
transformers' batched `generate` answered 96 requests (64 new tokens each) about
6x faster than MLX's CPU build with the BLAS shim (380 against 61 tokens/s, one
core each; docs/smollm2.md). MODEL_DIR is SmolLM2's GGUF weights written as a
transformers folder (export_hf.py): the same weights, computed in bfloat16, the
dtype SmolLM2 was released in.

Drafters must learn the target's own distribution (verification accepts against
it: docs/algorithm.md §6), so each request goes through the chat template and
the target answers it: two chunks in three greedily (what T = 0 serving sees),
one in three sampled at T = 1 (the distribution itself; no top-k or top-p).
Requests are answered in groups of 8 batches, each batch cut from the group's
requests of similar prompt length (less padding). Each group is written whole, in
request order, as OUT_DIR/group-NNNNNNN.jsonl.xz (its first request's index): a killed
run answers only the groups that are missing, and the recipe keeps the groups in the
repository (recipes/smollm2_drafters/answers/), so a later session on another machine
goes on where this one stopped.
Rows are {"prompt": templated conversation, "response": answer, "source",
"temperature"}, what `dflash2 train --data` reads.

--follow-up N takes the first N answered rows of ANSWERED_DIR and asks a
second question in the same conversation (a multi-turn row).
"""

import argparse
import json
import lzma
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

GROUP = 8  # batches per resumable group
FOLLOW_UPS = [
    "Can you explain that more simply?", "Can you give me an example?", "Make it shorter, please.",
    "Why is that?", "What are the drawbacks?", "Can you summarise that in one sentence?", "Tell me more.",
    "Can you put that in a bulleted list?", "What should I do next?", "Is there another way to do it?",
    "Thanks! Can you add comments to the code?", "Could you write that in JavaScript instead?",
    "What would a beginner get wrong here?", "How would you test that?", "Are you sure? Please double-check.",
]


def conversations(rows, follow_up: int, seed: int):
    """(messages, source) per request: one user turn, or a second turn after an answered one."""
    if not follow_up:
        return [([{"role": "user", "content": r["prompt"]}], r["source"]) for r in rows]
    rng = random.Random(seed)
    out = []
    for r in rows[:follow_up]:
        first = r.get("request") or r["prompt"]
        out.append(([{"role": "user", "content": first}, {"role": "assistant", "content": r["response"]},
                     {"role": "user", "content": rng.choice(FOLLOW_UPS)}], r["source"] + ":follow-up"))
    return out


def answer(model, tokenizer, texts: list[str], temperature: float, max_tokens: int, seed: int):
    """Answers to chat-templated `texts`, in order, and how many tokens each took."""
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=temperature > 0, temperature=temperature or None,
                              top_k=None, top_p=None, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(**enc, generation_config=config)
    new = out[:, enc.input_ids.shape[1] :]
    answers, counts = [], []
    for row in new.tolist():
        ids = row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
        answers.append(tokenizer.decode(ids, skip_special_tokens=True))
        counts.append(len(ids))
    return answers, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="SmolLM2 as a transformers folder (export_hf.py)")
    ap.add_argument("prompts", type=Path, help="requests: a JSONL file (.xz or plain) or a folder of answered groups")
    ap.add_argument("out", type=Path, help="the folder its answered groups go to (group-NNNNNNN.jsonl.xz)")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="the first this many requests of the shard (0: all)")
    ap.add_argument("--greedy-only", action="store_true", help="answer every chunk greedily")
    ap.add_argument("--follow-up", type=int, default=0, help="second turns after the first N answered rows")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    rows = read_rows(args.prompts)
    convs = conversations(rows, args.follow_up, args.seed)[args.shard :: args.shards]
    convs = convs[: args.limit] if args.limit else convs
    group = args.batch * GROUP
    todo = [start for start in range(0, len(convs), group) if not group_file(args.out, start).exists()]
    print(f"{len(convs) - sum(min(group, len(convs) - s) for s in todo)}/{len(convs)} requests answered before",
          file=sys.stderr, flush=True)
    if not todo:
        return
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    tic, made = time.time(), 0
    args.out.mkdir(parents=True, exist_ok=True)
    for start in todo:
        end = min(start + group, len(convs))
        texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                 for m, _ in convs[start:end]]
        answers = [None] * len(texts)
        # Which requests are sampled is fixed by their chunk of --batch (one in three);
        # within a group, batches are cut from requests of similar length (less padding).
        for temp in (0.0, 1.0):
            picked = [i for i in range(len(texts))
                      if temp == (0.0 if args.greedy_only or ((start + i) // args.batch) % 3 != 2 else 1.0)]
            picked.sort(key=lambda i: len(texts[i]))
            for b in range(0, len(picked), args.batch):
                rows = picked[b : b + args.batch]
                out, counts = answer(model, tokenizer, [texts[i] for i in rows], temp, args.max_tokens,
                                     seed=args.seed * 1_000_003 + args.shard * 100_003 + start + b + int(temp))
                for i, a in zip(rows, out):
                    answers[i] = (a, temp)
                made += sum(counts)
        lines = "".join(json.dumps({"prompt": t, "response": a, "source": src, "temperature": temp,
                                    "request": m[-1]["content"] if len(m) == 1 else None}) + "\n"
                        for (m, src), t, (a, temp) in zip(convs[start:end], texts, answers))
        path = group_file(args.out, start)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(lzma.compress(lines.encode()))
        tmp.replace(path)  # a group file is whole or absent
        print(f"group {start}-{end} of {len(convs)} requests written, {made} answer tokens this run, "
              f"{made / (time.time() - tic):.0f} tokens/s", file=sys.stderr, flush=True)


def group_file(folder: Path, start: int) -> Path:
    return folder / f"group-{start:07d}.jsonl.xz"


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file (.xz or plain) or of a folder of group files, in order."""
    files = sorted(path.glob("group-*.jsonl.xz")) if path.is_dir() else [path]
    rows = []
    for f in files:
        text = lzma.decompress(f.read_bytes()).decode() if f.suffix == ".xz" else f.read_text()
        rows += [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows


if __name__ == "__main__":
    main()
