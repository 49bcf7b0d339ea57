"""How long converting a 1B Q4_K_M GGUF takes, and its size in memory against the file.

    python benchmarks/gguf/gguf_convert_time.py [--file /tmp/llama-1b-q4km.gguf] \
        --json benchmarks/results/gguf-convert-1b-cpu.json

No 1B GGUF can be downloaded here, so the file is Llama 3.2 1B's shape (16 layers, hidden
2048, 32/8 heads, ffn 8192, 128,256-row tied embedding, rope_freqs) in llama.cpp's Q4_K_M
type mix (Q6_K embedding and the `use_more_bits` attn_v / ffn_down layers, Q4_K elsewhere)
with random blocks: the repack's work depends on the types and sizes, not on the values.
Written once (about 0.8 GB), then `convert_gguf` is timed on it, wall clock, three runs.
"""

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gguf_requantize import use_more_bits  # noqa: E402  (llama.cpp's rule, written once)

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF, VOCAB = 2048, 16, 32, 8, 64, 8192, 128256


def random_blocks(rng, rows: int, cols: int, kind: str) -> np.ndarray:
    """Random `kind` blocks with small, finite fp16 super-scales where the layout keeps them."""
    import gguf

    values, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, size=(rows * cols // values, size), dtype=np.uint8)
    scale_at = {"Q4_K": (0, 2), "Q6_K": (size - 2,)}[kind]
    for at in scale_at:
        d = rng.uniform(1e-4, 1e-3, size=blocks.shape[0]).astype(np.float16)
        blocks[:, at:at + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_file(path: Path) -> None:
    import gguf
    from gguf_files import Dims, bpe_parts, llama3_rope_freqs, tiny_bpe

    rng = np.random.default_rng(0)
    tokens, merges = bpe_parts(tiny_bpe())
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(131072)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([1] * len(tokens))
    T = gguf.GGMLQuantizationType
    # Llama 3.2's rope scaling (factor 32, low 1, high 4, original context 8192), as llama.cpp stores it.
    dims = Dims(hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, ff=FF)
    w.add_tensor("rope_freqs.weight", llama3_rope_freqs(dims, 500000.0, factor=32.0, low=1.0, high=4.0, orig=8192))
    w.add_tensor("token_embd.weight", random_blocks(rng, VOCAB, HIDDEN, "Q6_K"), raw_dtype=T.Q6_K)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        more = "Q6_K" if use_more_bits(i, LAYERS) else "Q4_K"
        for name, rows, cols, kind in (("attn_q", q, HIDDEN, "Q4_K"), ("attn_k", kv, HIDDEN, "Q4_K"),
                                       ("attn_v", kv, HIDDEN, more), ("attn_output", HIDDEN, q, "Q4_K"),
                                       ("ffn_gate", FF, HIDDEN, "Q4_K"), ("ffn_up", FF, HIDDEN, "Q4_K"),
                                       ("ffn_down", HIDDEN, FF, more)):
            w.add_tensor(f"blk.{i}.{name}.weight", random_blocks(rng, rows, cols, kind), raw_dtype=T[kind])
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(HIDDEN, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=Path(tempfile.gettempdir()) / "llama-1b-shape-q4km.gguf")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from dflash2_mlx.loading.gguf.convert import convert_gguf

    if not args.file.exists():
        write_file(args.file)
    times, memory = [], 0
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            folder = convert_gguf(args.file, Path(tmp) / "out")
            times.append(time.perf_counter() - t0)
            memory = (folder / "model.safetensors").stat().st_size
    import mlx.core as mx

    record = {"file": args.file.name, "shape": "Llama 3.2 1B, llama.cpp Q4_K_M type mix, random blocks",
              "file_bytes": args.file.stat().st_size, "converted_bytes": memory,
              "converted_over_file": round(memory / args.file.stat().st_size, 3),
              "convert_s": [round(t, 2) for t in times], "convert_s_median": round(sorted(times)[len(times) // 2], 2),
              "backend": "cpu" if not mx.metal.is_available() else "metal", "machine": platform.machine(),
              "note": "wall clock of convert_gguf (read, repack, write model.safetensors)"}
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
