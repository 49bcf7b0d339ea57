"""The GGUF converter checked against llama.cpp itself (llama-cpp-python): for the 3 chat prompts of
benchmarks/gguf/gguf_reference.py, the prompt's token ids (llama.cpp's tokenizer vs the rebuilt one),
the prompt's logits, and 64 greedy tokens (plain argmax, past end-of-turn) from llama.cpp on the
GGUF file and from mlx-lm on the converted folder. Writes a JSON record.

llama-cpp-python is not a dependency: PyPI has only its source, which compiles llama.cpp (about
half an hour on 2 cores). Run it from an environment that has it and sees this checkout:

    CMAKE_ARGS="-DGGML_OPENMP=OFF" /tmp/ref/bin/pip install llama-cpp-python diskcache
    PYTHONPATH=. /tmp/ref/bin/python benchmarks/gguf/gguf_llama_cpp_reference.py MODEL.gguf \
        --json benchmarks/results/gguf-llama-cpp-smollm2.json
"""

import argparse
import json
import tempfile
from pathlib import Path

PROMPTS = ["What is the capital of France?",
           "Write a Python function that returns the n-th Fibonacci number.",
           "If a train travels 60 km in 45 minutes, what is its average speed in km/h?"]
GREEDY_TOKENS = 64


def llama_cpp_side(gguf: Path, texts: list[str], ours: list[list[int]]):
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    ids_all, logits, greedy = [], [], []
    for text, our_ids in zip(texts, ours):
        ids_all.append(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        llm.reset()
        llm.eval(our_ids)  # the same ids on both sides, so logits compare row by row
        logits.append(np.array(llm.scores[: len(our_ids)], dtype=np.float32))
        seq = list(our_ids)
        for _ in range(GREEDY_TOKENS):
            token = int(np.argmax(llm.scores[len(seq) - 1]))
            seq.append(token)
            llm.eval([token])
        greedy.append(seq[len(our_ids):])
    return ids_all, logits, greedy


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import numpy as np
    from gguf_reference import mlx_side  # noqa: E402  (benchmarks/ is not a package)
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from dflash2_mlx.loading.gguf.convert import convert_gguf

    with tempfile.TemporaryDirectory() as tmp:
        folder = convert_gguf(args.gguf, Path(tmp) / "model")
        tokenizer = load_tokenizer(folder)
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               tokenize=False) for p in PROMPTS]
        ours = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        our_logits, our_greedy = mlx_side(folder, ours)
    ref_ids, ref_logits, ref_greedy = llama_cpp_side(args.gguf, texts, ours)
    rows = []
    for p, a, b, la, lb, ga, gb in zip(PROMPTS, ours, ref_ids, our_logits, ref_logits, our_greedy, ref_greedy):
        first = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), None)
        rows.append({
            "prompt": p, "prompt_tokens": len(a), "same_prompt_ids": a == b,
            "max_abs_logit_diff": float(np.abs(la - lb).max()), "max_logit_magnitude": float(np.abs(lb).max()),
            "same_argmax_rows": int((la.argmax(-1) == lb.argmax(-1)).sum()),
            "greedy_tokens": len(ga), "greedy_identical": ga == gb, "first_greedy_divergence": first,
            # The first answer token's competition on each side: a near-tie flips under small rounding.
            "last_prompt_row_top2": {side: [[tokenizer.decode([int(t)]), round(float(l[-1][t]), 3)]
                                            for t in np.argsort(-l[-1])[:2]] for side, l in (("ours", la), ("llama_cpp", lb))},
            "greedy_text": tokenizer.decode(ga), "llama_cpp_greedy_text": tokenizer.decode(gb),
        })
    record = {"gguf": args.gguf.name, "reference": "llama.cpp (llama-cpp-python), CPU", "prompts": rows}
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
