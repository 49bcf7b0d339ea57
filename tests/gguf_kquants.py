"""K-quant blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) written from float rows, for test files.

gguf-py dequantizes every K type but quantizes none, and llama.cpp's quantizer is C. This is
a plain round-to-nearest quantizer (no llama.cpp error search) that writes the exact block
layouts; `test_gguf_types.py` checks it against gguf-py's own dequantizer, so the files the
tests convert are what llama.cpp would read. Each function takes (n, 256) float32 rows of
blocks and returns (n, block bytes) uint8.
"""

import numpy as np


def _div(a, b):
    return np.where(b == 0, 0, a / np.where(b == 0, 1, b))


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _affine_subblocks(x: np.ndarray, sub: int, levels: int, index_max: int):
    """Per sub-block scale and min (value = d·sc·q − dmin·m) with sc, m quantized to index_max."""
    n = x.shape[0]
    xs = x.reshape(n, -1, sub)
    lo = np.minimum(xs.min(-1), 0)  # the formats' min is subtracted: it must not be positive
    scale, mn = (xs.max(-1) - lo) / levels, -lo
    d, dmin = scale.max(-1, keepdims=True) / index_max, mn.max(-1, keepdims=True) / index_max
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(_div(scale, d)), 0, index_max).astype(np.uint8)
    m = np.clip(np.round(_div(mn, dmin)), 0, index_max).astype(np.uint8)
    q = np.round(_div(xs + (dmin * m)[..., None], (d * sc)[..., None]))
    return d, dmin, sc, m, np.clip(q, 0, levels).astype(np.uint8).reshape(n, -1)


def _k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins in Q4_K/Q5_K's 12 bytes (inverse of get_scale_min_k4)."""
    lo = (sc[:, :4] | ((sc[:, 4:] >> 4) << 6)).astype(np.uint8)
    mid = (m[:, :4] | ((m[:, 4:] >> 4) << 6)).astype(np.uint8)
    hi = ((sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)).astype(np.uint8)
    return np.concatenate([lo, mid, hi], axis=1)


def _nibble_chunks(q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes: chunk i holds sub-block 2i in low nibbles, 2i+1 in high ones."""
    q = q.reshape(-1, 4, 2, 32) & 0x0F
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def q4_k(x):
    d, dmin, sc, m, q = _affine_subblocks(x, 32, 15, 63)
    return np.concatenate([_f16(d), _f16(dmin), _k4_scales(sc, m), _nibble_chunks(q)], axis=1)


def q5_k(x):
    d, dmin, sc, m, q = _affine_subblocks(x, 32, 31, 63)
    high = (q.reshape(-1, 8, 32) >> 4) & 1
    qh = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8).reshape(1, 8, 1), axis=1).astype(np.uint8)
    return np.concatenate([_f16(d), _f16(dmin), _k4_scales(sc, m), qh, _nibble_chunks(q)], axis=1)


def q2_k(x):
    d, dmin, sc, m, q = _affine_subblocks(x, 16, 3, 15)
    scales = (sc | (m << 4)).astype(np.uint8)
    return np.concatenate([scales, _two_bit_planes(q), _f16(d), _f16(dmin)], axis=1)


def _two_bit_planes(q: np.ndarray) -> np.ndarray:
    """64 bytes: value h·128 + k·32 + l sits at bits 2k of byte h·32 + l (Q2_K, Q3_K)."""
    q = (q.reshape(-1, 2, 4, 32) & 3).astype(np.uint8)
    return np.bitwise_or.reduce(q << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1), axis=2).reshape(-1, 64)


def _symmetric_subblocks(x: np.ndarray, qmax: float, index_max: int):
    """Per 16-value sub-block signed scale under one fp16 d: value = d·sc·q."""
    n = x.shape[0]
    xs = x.reshape(n, 16, 16)
    # As llama.cpp's make_qx_quants: the value of largest magnitude maps to -qmax, so scales
    # take both signs (a reader that takes them unsigned is caught).
    peak = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1)[..., 0]
    scale = peak / -qmax
    d = (np.abs(scale).max(-1, keepdims=True) / index_max).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(_div(scale, d)), -index_max - 1, index_max)
    q = np.round(_div(xs, (d * sc)[..., None]))
    return d, sc.astype(np.int8), q


def q3_k(x):
    d, sc, q = _symmetric_subblocks(x, 4.0, 31)
    q3 = np.clip(q, -4, 3).astype(np.int8).reshape(-1, 256)
    ql = np.where(q3 >= 0, q3, q3 + 4).astype(np.uint8)
    hbit = (q3 >= 0).astype(np.uint8).reshape(-1, 8, 32)
    hmask = np.bitwise_or.reduce(hbit << np.arange(8, dtype=np.uint8).reshape(1, 8, 1), axis=1).astype(np.uint8)
    s6 = (sc.astype(np.int16) + 32).astype(np.uint8)
    low = (s6[:, :8] & 0x0F) | ((s6[:, 8:] & 0x0F) << 4)
    hi2 = (s6 >> 4).reshape(-1, 4, 4)  # [k, b]: scale k·4 + b
    high = np.bitwise_or.reduce(hi2 << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1), axis=1)
    return np.concatenate([hmask, _two_bit_planes(ql), low.astype(np.uint8), high.astype(np.uint8), _f16(d)], axis=1)


def q6_k(x):
    d, sc, q = _symmetric_subblocks(x, 32.0, 127)
    q6 = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 2, 64)  # [half, nibble, byte]
    ql = ((q6[:, :, 0] & 0x0F) | ((q6[:, :, 1] & 0x0F) << 4)).reshape(-1, 128)
    hi = (q6.reshape(-1, 2, 4, 32) >> 4) & 3  # [half, shift, byte]
    qh = np.bitwise_or.reduce(hi << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1), axis=2).reshape(-1, 64)
    return np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), sc.view(np.uint8), _f16(d)], axis=1)


IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def iq4_nl(x):
    """(n, 32) rows -> IQ4_NL blocks: fp16 d, then each value's nearest level as Q4_0 packs nibbles."""
    peak = np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)
    d = (peak / IQ4_NL_LEVELS[0]).astype(np.float16).astype(np.float32)
    q = np.abs(_div(x, d)[..., None] - IQ4_NL_LEVELS).argmin(-1).astype(np.uint8)
    return np.concatenate([_f16(d), (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)], axis=1)


QUANTIZERS = {"Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}


def quantize(w: np.ndarray, kind: str) -> np.ndarray:
    """Rows of `w` (cols a multiple of 256) as `kind` blocks, shaped (rows, row bytes) as gguf's writer takes them."""
    import gguf

    if kind == "IQ4_NL":
        return iq4_nl(w.reshape(-1, 32).astype(np.float32)).reshape(w.shape[0], -1)
    if kind.startswith("IQ"):  # no quantizer anywhere in Python: zero blocks, for the refusal tests
        values, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
        return np.zeros((w.shape[0], w.shape[1] // values * size), np.uint8)
    if kind not in QUANTIZERS:
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind])
    rows = w.shape[0]
    return QUANTIZERS[kind](w.reshape(-1, 256).astype(np.float32)).reshape(rows, -1)
