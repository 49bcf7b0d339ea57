"""Small GGUF files of every type and family the converter reads, for benchmarks/gguf/gguf_reference.py.

    python benchmarks/gguf/gguf_tiny_files.py OUT_DIR

Written by the tests' writer (tests/gguf_files.py: gguf-py's GGUFWriter, random weights, the
real metadata keys and tensor layouts): `type-<T>.gguf`, a llama with every 2-D tensor of
type T (hidden 256, so K-quant rows are whole blocks), and `family-<F>.gguf` for llama with
Llama 3 rope scaling, qwen2, qwen3, gemma3, phi3 and mistral (llama with a SentencePiece
vocabulary), in Q8_0. Gemma 3 gets head_dim 256 and Qwen3 128, as the real models have:
transformers' GGUF loader reads neither from the file (it fills Gemma's `query_pre_attn_scalar`
with 256 where llama.cpp and this converter use head_dim, and Qwen3's head_dim with 128).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from gguf_files import KQUANT, Dims, write_gguf  # noqa: E402

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
FAMILIES = {
    "llama3-rope": dict(family="llama", dims=Dims(hidden=256, heads=4, kv_heads=2, head_dim=64, ff=512),
                        theta=500000.0, llama3_rope=dict(factor=8.0, low=1.0, high=4.0, orig=64)),
    "qwen2": dict(family="qwen2"),
    "qwen3": dict(family="qwen3", dims=Dims(hidden=256, heads=2, kv_heads=1, head_dim=128, ff=512)),
    "gemma3": dict(family="gemma3", tokenizer_model="llama",
                   dims=Dims(hidden=256, layers=6, heads=2, kv_heads=1, head_dim=256, ff=512), sliding_window=4),
    "phi3": dict(family="phi3", tokenizer_model="llama"),
    "mistral": dict(family="llama", tokenizer_model="llama"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in TYPES:
        write_gguf(args.out / f"type-{kind}.gguf", "llama", kind, kind, tie=False, dims=KQUANT)
    for name, kwargs in FAMILIES.items():
        write_gguf(args.out / f"family-{name}.gguf", linear="Q8_0", embed="Q8_0", **kwargs)
    print("\n".join(sorted(str(p) for p in args.out.glob("*.gguf"))))


if __name__ == "__main__":
    main()
