"""Write K-quant variants of a GGUF file (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K), for the real-file
checks of docs/gguf.md: SmolLM2's only GGUF on a registry is Q4_1.

    python benchmarks/gguf/gguf_requantize.py SRC.gguf OUT_DIR [--types Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K]

Each tensor is dequantized with gguf-py and quantized again to the type llama.cpp's
`llama-quantize` gives it for that file type (src/llama-quant.cpp, llama_tensor_get_type,
the cases that apply to a dense llama: the output / tied embedding, attn_v, ffn_down and
attn_output rules, `use_more_bits`, and the fallbacks for rows that are not a multiple of
256 — SmolLM2's 576 — which turn Q4_K into Q5_0, Q5_K into Q5_1, Q6_K into Q8_0 and
Q2_K/Q3_K into IQ4_NL). The blocks are written by the tests' round-to-nearest quantizer
(tests/gguf_kquants.py, checked against gguf-py's dequantizer), not llama.cpp's error
search: same layouts and type mix, a little more rounding error. All metadata is copied.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from gguf_kquants import quantize  # noqa: E402

BASE = {"Q2_K": "Q2_K", "Q3_K_M": "Q3_K", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K"}
FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, ftype: str, cols: int, layers: int, gqa: int, has_output: bool) -> str:
    """llama.cpp's choice for one 2-D tensor of a dense llama model."""
    kind = BASE[ftype]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        kind = "Q8_0" if cols % 256 else "Q6_K"
        return kind
    if ".attn_v." in name:
        kind = {"Q2_K": "Q4_K" if gqa >= 4 else "Q3_K", "Q3_K_M": "Q5_K" if layer < 2 else "Q4_K",
                "Q4_K_M": "Q6_K" if use_more_bits(layer, layers) else "Q4_K",
                "Q5_K_M": "Q6_K" if use_more_bits(layer, layers) else "Q5_K"}.get(ftype, kind)
    elif ".ffn_down." in name:
        kind = {"Q2_K": "Q3_K", "Q3_K_M": "Q5_K" if layer < layers // 16 else "Q4_K",
                "Q4_K_M": "Q6_K" if use_more_bits(layer, layers) else "Q4_K",
                "Q5_K_M": "Q6_K" if use_more_bits(layer, layers) else "Q5_K"}.get(ftype, kind)
    elif ".attn_output." in name:
        kind = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(ftype, kind)
    if cols % 256:
        kind = FALLBACK[kind]
    return kind


def requantize(src: Path, out: Path, ftype: str) -> dict[str, int]:
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), main, sub_type=sub)
    layers = reader.fields[f"{arch}.block_count"].contents()
    gqa = reader.fields[f"{arch}.attention.head_count"].contents() // reader.fields[
        f"{arch}.attention.head_count_kv"].contents()
    names = {t.name for t in reader.tensors}
    counts: dict[str, int] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if len(shape) == 1:
            writer.add_tensor(t.name, values)
            counts["F32"] = counts.get("F32", 0) + 1
            continue
        kind = tensor_type(t.name, ftype, shape[-1], layers, gqa, "output.weight" in names)
        writer.add_tensor(t.name, quantize(values, kind), raw_dtype=gguf.GGMLQuantizationType[kind])
        counts[kind] = counts.get(kind, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.src.stem.split(".")[0]
    for ftype in args.types.split(","):
        path = args.out / f"{stem}.{ftype}.gguf"
        counts = requantize(args.src, path, ftype)
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB, tensors by type {counts}")


if __name__ == "__main__":
    main()
