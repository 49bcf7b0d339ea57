"""The GGUF converter checked against an independent implementation: transformers' own
GGUF loader (`from_pretrained(dir, gguf_file=...)`, which dequantizes every GGML type itself
and builds the tokenizer its own way).

For each file: the conversion time, the converted model's bytes in memory against the
file's, and for 3 chat prompts the prompt's token ids (both tokenizers), the logits of the
prompt's forward pass (mlx-lm on the converted folder, packed weights, fp32 activations, vs
torch fp32 on transformers' dequantized weights) and 64 greedy tokens. Writes a JSON record
with one entry per file.

Needs torch, which this project does not depend on (and which would slow transformers'
import for everything else): run it from an environment that has torch and gguf and sees
this checkout, e.g.

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 gguf
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/ref/lib/python3.11/site-packages/zz.pth
    PYTHONPATH=. /tmp/ref/bin/python benchmarks/gguf/gguf_reference.py A.gguf [B.gguf ...] \
        --json benchmarks/results/gguf-reference.json

`--no-unpermute` converts without undoing llama.cpp's q/k row permutation, to show that
the check catches it.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

PROMPTS = ["What is the capital of France?",
           "Write a Python function that returns the n-th Fibonacci number.",
           "If a train travels 60 km in 45 minutes, what is its average speed in km/h?"]
GREEDY_TOKENS = 64


def mlx_side(folder: Path, prompts_ids: list[list[int]]):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    model.set_dtype(mx.float32)  # packed weights stay packed; fp32 activations as the engine runs them on CPU
    logits, greedy = [], []
    for ids in prompts_ids:
        logits.append(np.array(model(mx.array(ids)[None])[0].astype(mx.float32)))
        out = []
        for token, _ in generate_step(mx.array(ids), model, max_tokens=GREEDY_TOKENS):
            out.append(int(token))
        greedy.append(out)
    return logits, greedy


def torch_side(gguf: Path, texts: list[str], llama3_rope: dict | None = None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if llama3_rope:  # transformers' GGUF loader ignores rope_freqs: give it the model's own parameters
        config.rope_parameters = {**config.rope_parameters, "rope_type": "llama3", **llama3_rope}
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, config=config,
                                                 dtype=torch.float32)
    model.eval()
    ids_all, logits, greedy = [], [], []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids_all.append(ids)
        with torch.no_grad():
            logits.append(model(torch.tensor([ids])).logits[0].float().numpy())
            # Plain argmax steps, past end-of-turn as mlx-lm's generate_step goes (generate() would
            # stop there, or with min_new_tokens mask the end token and pick another).
            seq = list(ids)
            for _ in range(GREEDY_TOKENS):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        greedy.append(seq[len(ids):])
    return ids_all, logits, greedy


def check_file(path: Path, tmp: Path, args) -> dict:
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import load_model

    from gguf import GGUFReader

    from dflash2_mlx.loading.gguf.convert import convert_gguf

    t0 = time.perf_counter()
    folder = convert_gguf(path, tmp / path.stem)
    convert_s = time.perf_counter() - t0
    model, _ = load_model(folder)
    memory = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    del model
    tokenizer = load_tokenizer(folder)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False) for p in PROMPTS]
    ours = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    llama3 = None
    if args.llama3_rope and "rope_freqs.weight" in {t.name for t in GGUFReader(str(path)).tensors}:
        names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        llama3 = dict(zip(names, (float(v) for v in args.llama3_rope.split(","))))
        llama3["original_max_position_embeddings"] = int(llama3["original_max_position_embeddings"])
    ref_ids, ref_logits, ref_greedy = torch_side(path, texts, llama3)
    our_logits, our_greedy = mlx_side(folder, ours)
    rows = []
    for p, a, b, la, lb, ga, gb in zip(PROMPTS, ours, ref_ids, our_logits, ref_logits, our_greedy, ref_greedy):
        diff = np.abs(la - lb) if la.shape == lb.shape else None
        first = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), None)
        rows.append({
            "prompt": p, "prompt_tokens": len(a), "same_prompt_ids": a == b,
            "max_abs_logit_diff": float(diff.max()) if diff is not None else None,
            "max_logit_magnitude": float(np.abs(lb).max()),
            "same_argmax_rows": int((la.argmax(-1) == lb.argmax(-1)).sum()) if diff is not None else None,
            "greedy_tokens": len(ga), "greedy_identical": ga == gb, "first_greedy_divergence": first,
            "greedy_text": tokenizer.decode(ga),
        })
    return {"gguf": path.name, "file_bytes": path.stat().st_size, "memory_bytes": int(memory),
            "memory_over_file": round(memory / path.stat().st_size, 3), "convert_s": round(convert_s, 2),
            "unpermuted_qk": not args.no_unpermute, "reference_llama3_rope": llama3, "prompts": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path, nargs="+")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-unpermute", action="store_true")
    ap.add_argument("--llama3-rope", metavar="FACTOR,LOW,HIGH,ORIG",
                    help="for files with rope_freqs, the model's Llama 3 rope parameters, which transformers' GGUF "
                         "loader does not read (it runs such files unscaled): e.g. 8,1,4,8192 for Llama 3.1")
    args = ap.parse_args()
    from dflash2_mlx.loading.gguf import weights as gguf_weights

    if args.no_unpermute:
        gguf_weights.unpermute_rows = lambda x, heads: x
    from dflash2_mlx.files import atomic_write_text

    record = {"reference": "transformers GGUF loader (torch fp32, its own dequantization and tokenizer)",
              "greedy_tokens": GREEDY_TOKENS, "files": []}
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.gguf:
            try:
                record["files"].append(check_file(path, Path(tmp), args))
            except Exception as e:  # one file's failure (ours or the reference's) is a row, not the end
                record["files"].append({"gguf": path.name, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
            print(json.dumps({k: v for k, v in record["files"][-1].items() if k != "prompts"}), flush=True)
            if args.json:  # after every file: a long run that stops keeps what it measured
                atomic_write_text(args.json, json.dumps(record, indent=2) + "\n")
    if not args.json:
        print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
