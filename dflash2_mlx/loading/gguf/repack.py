"""GGUF tensor blocks as MLX affine quantization (w = scale * q + bias, groups of 32 along a row).

Vectorised numpy over the raw blocks (gguf-py's reader memory-maps them); no per-block
Python. Which home each GGML type gets, and why:

- Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: one fp16 scale per 32 values, so they are MLX groups of 32
  at 8, 4, 4, 5, 5 bits as they are: q is the stored integer (signed types shifted to
  unsigned), scale = d, bias = -offset·d or m. Exact: offset·d is a power-of-two multiple of
  an fp16 number.
- IQ4_NL: 32 values per fp16 d, each d times one of 16 integer levels in -127..113, so an
  8-bit group with q = level + 128, scale = d, bias = -128·d: exact, at twice its bytes.
  llama.cpp writes it for Q2_K/Q3_K rows that are not a multiple of 256 (SmolLM2's 576),
  so real Q2_K and Q3_K_M files of such models hold it. The other IQ types and the ternary
  ones are refused (weights.check_types).
- Q4_K, Q5_K: sub-blocks of 32 with 6-bit scale and min indices under two fp16 super-scales:
  w = d·sc·q − dmin·m, so 4- and 5-bit groups of 32 with scale = d·sc, bias = −dmin·m. Those
  products need up to 17 significant bits; they are rounded once to float16 (relative error
  at most 2^-11 per scale), the dtype MLX computes quantized layers in. q is exact.
- Q6_K, Q3_K, Q2_K: sub-blocks of 16 values each with their own scale, which MLX's group
  sizes (32, 64, 128) cannot hold exactly at any width (Q6_K's d·sc·(q−32) needs up to 24
  significant bits: not even float16 holds it). Each pair of sub-blocks becomes one group of
  32 on the grid of the pair's coarser sub-block, its step divided so the group has more
  levels: Q6_K at 8 bits (4 steps per Q6_K step), Q3_K at 4 bits (2), Q2_K at 3 bits (2).
  The coarser sub-block's values stay exact, the finer one's are rounded to that grid. A
  stated, measured approximation (docs/gguf.md): on the tests' weights it adds 0.2x (Q6_K),
  0.4x (Q3_K) and 0.43x (Q2_K) of the format's own rounding error, where the same bits
  added 0.8-0.9x; memory for those tensors is 1.37x, 1.45x and 1.52x their bytes. (Same-bits
  homes were tried first and measured: SmolLM2's Q6_K ffn_down alone moved logits by 1.7;
  `mx.quantize` on the values errs up to a whole step.)
"""

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

GROUP_SIZE = 32
FLOAT_TYPES = ("F32", "F16", "BF16")
EXACT_BITS = {"Q8_0": 8, "Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q4_K": 4, "Q5_K": 5, "IQ4_NL": 8}
IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16)
REQUANTIZED_BITS = {"Q6_K": 8, "Q3_K": 4, "Q2_K": 3}
SUPPORTED = FLOAT_TYPES + tuple(EXACT_BITS) + tuple(REQUANTIZED_BITS)
CHUNK_ROWS = 4096  # rows converted at a time: bounds the temporaries of a 128k-row embedding


@dataclass
class Packed:
    """An MLX quantized weight: packed q (uint32), fp16 scales and biases, bits."""

    weight: mx.array
    scales: mx.array
    biases: mx.array
    bits: int


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 fields (n_blocks, 2) uint8 as float32 (n_blocks, 1)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k·16) bytes as (n, k, 32) values: the low nibbles of 16 bytes first, then their highs."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1, 32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 high bits (one uint32 per block, bit j for value j) as (n, 1, 32) 0/16."""
    bits = np.ascontiguousarray(qh).view(np.uint32) >> np.arange(32, dtype=np.uint32)
    return ((bits & 1) << 4).astype(np.uint8).reshape(-1, 1, 32)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scale and min indices (llama.cpp's get_scale_min_k4)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def decode_blocks(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q uint8 (n, values), scale f32 (n, groups), bias f32 (n, groups)) of `n` raw blocks,
    with value = scale · q + bias exactly (computed in float32) for each group of 32."""
    n = blocks.shape[0]
    if kind == "Q8_0":
        d = _f16(blocks[:, :2])
        q = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q, d, -128 * d
    if kind == "IQ4_NL":
        d = _f16(blocks[:, :2])
        q = (IQ4_NL_LEVELS[_nibbles(blocks[:, 2:]).reshape(n, 32)] + 128).astype(np.uint8)
        return q, d, -128 * d
    if kind in ("Q4_0", "Q5_0"):
        d = _f16(blocks[:, :2])
        if kind == "Q4_0":
            return _nibbles(blocks[:, 2:]).reshape(n, 32), d, -8 * d
        q = _nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])
        return q.reshape(n, 32), d, -16 * d
    if kind in ("Q4_1", "Q5_1"):
        d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        if kind == "Q4_1":
            return _nibbles(blocks[:, 4:]).reshape(n, 32), d, m
        q = _nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])
        return q.reshape(n, 32), d, m
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        # The last 128 bytes: 4 chunks of 32, low nibbles sub-block 2i, high ones 2i+1.
        q = (blocks[:, -128:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        if kind == "Q5_K":  # qh (bytes 16..47): bit j of byte l is the fifth bit of value l in sub-block j
            high = (blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
            q = q.reshape(n, 8, 32) | (high << 4)
        return q.reshape(n, 256), d * sc, -(dmin * mn)
    raise ValueError(f"{kind} has no exact MLX home")


def subblock_affine(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(scale, offset) f32 (n, 16) of each 16-value sub-block, value = scale · q + offset with q
    in 0..levels, and levels, for the 16-value types (read as gguf-py's dequantizers read them)."""
    if kind == "Q6_K":  # ql[128] qh[64] scales int8[16] d
        scale = _f16(blocks[:, 208:210]) * blocks[:, 192:208].view(np.int8).astype(np.float32)
        return scale, -32 * scale, 63
    if kind == "Q3_K":  # hmask[32] qs[64] scales[12] d: 6-bit scales stored +32
        s = blocks[:, 96:108]
        low = (s[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(-1, 16) & 0x0F
        high = (s[:, 8:].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(-1, 16) & 3
        scale = _f16(blocks[:, 108:110]) * ((low | (high << 4)).astype(np.float32) - 32)
        return scale, -4 * scale, 7
    if kind == "Q2_K":  # scales[16] (scale | min << 4) qs[64] d dmin
        s = blocks[:, :16]
        scale = _f16(blocks[:, 80:82]) * (s & 0x0F).astype(np.float32)
        return scale, -_f16(blocks[:, 82:84]) * (s >> 4).astype(np.float32), 3
    raise ValueError(f"{kind} has no 16-value sub-blocks")


def requantize_pairs(values: np.ndarray, scale: np.ndarray, offset: np.ndarray, levels: int, bits: int):
    """Pairs of 16-value affine sub-blocks as one 32-value group each, at `bits`: (q, scale, bias).

    The group's step is the coarser sub-block's step divided by the whole number of times its
    `levels` fit in the `bits` (1 at the same bits, 4 from Q6_K's 63 to 8 bits' 255), and the
    grid starts at the coarser sub-block's minimum moved down by whole steps until it reaches
    the finer one's: the coarser values keep exact q; where that grid cannot reach the pair's
    maximum, the pair's min..max grid is used instead."""
    n, top = values.shape[0], 2 ** bits - 1
    # A negative scale is the same grid read backwards: make every step positive.
    lo = np.where(scale < 0, offset + scale * levels, offset)
    step = np.abs(scale)
    hi = lo + step * levels
    lo2, hi2, step2 = (a.reshape(n, -1, 2) for a in (lo, hi, step))
    coarse = np.argmax(step2, axis=-1)[..., None]
    s = np.take_along_axis(step2, coarse, -1)[..., 0] / (top // levels)
    base = np.take_along_axis(lo2, coarse, -1)[..., 0]
    low, high = lo2.min(-1), hi2.max(-1)
    safe = np.where(s > 0, s, 1)
    b = base - s * np.ceil(np.maximum(base - low, 0) / safe - 1e-6)
    fallback = (b + s * top < high - 1e-6 * np.abs(high)) | (s == 0)
    s = np.where(fallback, (high - low) / top, s)
    b = np.where(fallback, low, b)
    v = values.reshape(n, -1, 32)
    q = np.rint((v - b[..., None]) / np.where(s > 0, s, 1)[..., None])
    return np.clip(q, 0, top).astype(np.uint8).reshape(n, -1), s, b


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned `bits`-bit values (rows, cols) in MLX's packing: a little-endian bit stream per
    row, read as uint32 words (checked against mx.dequantize in the tests). Built a few bytes
    at a time: `per` values fill `size` whole bytes (2 values a byte at 4 bits, 8 values in 5
    bytes at 5 bits)."""
    rows = q.shape[0]
    size = {2: 1, 3: 3, 4: 1, 5: 5, 6: 3, 8: 1}[bits]
    per = size * 8 // bits
    if bits == 8:
        return np.ascontiguousarray(q, dtype=np.uint8).view(np.uint32)
    groups = q.reshape(rows, -1, per)
    acc = np.zeros(groups.shape[:2], np.uint64 if size > 1 else np.uint8)
    for k in range(per):
        acc |= groups[..., k].astype(acc.dtype) << acc.dtype.type(bits * k)
    if size == 1:
        return acc.view(np.uint32)
    stream = np.empty(groups.shape[:2] + (size,), np.uint8)
    for j in range(size):
        stream[..., j] = (acc >> np.uint64(8 * j)) & np.uint64(0xFF)
    return stream.reshape(rows, -1).view(np.uint32)


def block_bytes(kind: str) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]


def repack(kind: str, raw: np.ndarray, cols: int) -> Packed:
    """Rows of raw `kind` blocks (rows, row_bytes) as an MLX quantized weight of `cols` columns."""
    rows = raw.shape[0]
    size = block_bytes(kind)
    bits = EXACT_BITS.get(kind) or REQUANTIZED_BITS[kind]
    packed, scales, biases = [], [], []
    for start in range(0, rows, CHUNK_ROWS):
        chunk = np.asarray(raw[start:start + CHUNK_ROWS])
        r = chunk.shape[0]
        blocks = chunk.reshape(-1, size)
        if kind in EXACT_BITS:
            q, s, b = decode_blocks(kind, blocks)
        else:
            from gguf import quants

            # The type's own block dequantizer on the whole chunk (quants.dequantize walks rows).
            values = getattr(quants, kind).dequantize_blocks(blocks).reshape(-1, 256)
            q, s, b = requantize_pairs(values, *subblock_affine(kind, blocks), bits)
        packed.append(mx.array(pack_bits(q.reshape(r, cols), bits)))
        scales.append(mx.array(s.reshape(r, -1).astype(np.float16)))
        biases.append(mx.array(b.reshape(r, -1).astype(np.float16)))
        mx.eval(packed[-1], scales[-1], biases[-1])
    join = (lambda xs: xs[0]) if len(packed) == 1 else (lambda xs: mx.concatenate(xs, axis=0))
    return Packed(join(packed), join(scales), join(biases), bits)


def float_tensor(kind: str, data: np.ndarray) -> mx.array:
    """F32, F16 as they are; BF16 (stored as raw 16-bit words) as MLX bfloat16, not widened."""
    if kind == "BF16":
        return mx.array(np.ascontiguousarray(data).view(np.uint16)).view(mx.bfloat16)
    return mx.array(np.ascontiguousarray(data))
