"""The GGUF tokenizer rebuild checked against transformers' own GGUF tokenizer converter, for
each text-splitting rule (`tokenizer.ggml.pre`) this project maps, on tiny files written by
tests/gguf_files.py (same vocabulary and merges; only the rule differs). Writes a JSON record.

transformers' GGUF code needs torch: run it from the environment benchmarks/gguf/gguf_reference.py
describes:

    PYTHONPATH=. /tmp/ref/bin/python benchmarks/gguf/gguf_tokenizer_reference.py --json benchmarks/results/gguf-tokenizers.json

transformers does not split digits one by one for llama files, which llama.cpp's `smollm` rule
and SmolLM's own tokenizer.json do: there the two are expected to differ on multi-digit numbers.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

TEXTS = ["def add(a, b):\n    return a + b  # 12345 + 678\n\n\n\tx",
         "The capital   of France's 1999 é 中文 🙂\r\n end", "I'll  we've 3.14159 ABC's <|im_start|>user"]
RULES = [("qwen2", "qwen2"), ("llama", "llama-bpe"), ("llama", "smollm"), ("llama", "gpt2"), ("llama", "tekken")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from gguf_files import write_gguf
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from transformers import AutoTokenizer

    from dflash2_mlx.loading.gguf.convert import convert_gguf

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family, pre in RULES:
            path, _, _ = write_gguf(Path(tmp) / f"{family}-{pre}.gguf", family, pre=pre)
            ours = load_tokenizer(convert_gguf(path, Path(tmp) / f"{family}-{pre}"))
            ref = AutoTokenizer.from_pretrained(tmp, gguf_file=path.name)
            for text in TEXTS:
                a = ours.encode(text, add_special_tokens=False)
                b = ref(text, add_special_tokens=False)["input_ids"]
                rows.append({"architecture": family, "pre": pre, "text": text, "identical": a == b,
                             "ours": ours.convert_ids_to_tokens(a) if a != b else None,
                             "transformers": ref.convert_ids_to_tokens(b) if a != b else None})
    record = {"reference": "transformers AutoTokenizer.from_pretrained(gguf_file=...)", "texts": rows}
    text = json.dumps(record, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
