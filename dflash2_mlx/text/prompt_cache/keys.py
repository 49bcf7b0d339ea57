"""Block keys: a hash chain over fixed-size token blocks, seeded by what makes
a cached row valid.

Block k's key is sha256(key of block k-1, the block's token ids); block 0's
parent is the fingerprint of the pair. Equal keys therefore mean the same
pair, the same settings and the same tokens from the very first one, so a
prefix shared by many conversations has one set of keys and a branch shares
the keys up to the block it changes.
"""

import hashlib
import json
from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ...device import backend_name
from ...engine.pair import Pair

# Bump when the stored layout changes: older files then have other keys and are never read.
FORMAT_VERSION = 2  # 2: a block's snapshot is its own entry (snapshot thinning)

# Elements sampled from every tensor for `weights_fingerprint`: enough that two checkpoints of one
# architecture (a fine-tune, another seed) differ in some of them, few enough to cost nothing.
SAMPLES_PER_TENSOR = 64


def weights_fingerprint(module: Optional[nn.Module]) -> Optional[str]:
    """A hex digest of `module`'s weights: every tensor's name, shape, dtype and
    SAMPLES_PER_TENSOR elements spread over it. `Pair.identity` checksums only the
    norm weights, which two look-alike checkpoints (same architecture, norms left
    at one) share, so a folder shared by two pairs would serve one the other's rows."""
    if module is None:
        return None
    params = sorted(tree_flatten(module.parameters()))
    picks = []
    for _, p in params:
        flat = p.reshape(-1)
        n = min(SAMPLES_PER_TENSOR, flat.size)
        picks.append(flat[mx.array(np.linspace(0, flat.size - 1, n).astype(np.int64))] if n else flat)
    mx.eval(picks)
    h = hashlib.sha256()
    for (name, p), pick in zip(params, picks):
        h.update(json.dumps([name, list(p.shape), str(p.dtype)]).encode())
        h.update(memoryview(pick).tobytes())
    return h.hexdigest()


def pair_fingerprint(pair: Pair, block_tokens: int) -> str:
    """A hex digest of everything the cached rows depend on: both models (their
    weights, `weights_fingerprint`), their dtypes and quantization, the layers the
    drafter taps, its context window, the target's rollback room, the backend and
    the block size."""
    facts = {
        "version": FORMAT_VERSION, "backend": backend_name(), "block_tokens": block_tokens, **pair.identity(),
        "weights": {"target": weights_fingerprint(pair.target.model), "drafter": weights_fingerprint(pair.drafter)},
        "max_block": getattr(pair.target, "max_block", None), "layer_ids": list(pair.layer_ids or ()),
        "context_window": getattr(pair.drafter, "context_window", None),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def block_keys(fingerprint: str, ids: Sequence[int], block_tokens: int) -> list[str]:
    """The keys of every whole block of `ids` (a trailing partial block has none)."""
    keys, parent = [], fingerprint
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        block = mx.array(list(ids[start : start + block_tokens]), dtype=mx.int64)
        parent = hashlib.sha256(parent.encode() + memoryview(block).tobytes()).hexdigest()
        keys.append(parent)
    return keys
