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
from typing import Sequence

import mlx.core as mx

from ...device import backend_name
from ...engine.pair import Pair

# Bump when the stored layout changes: older files then have other keys and are never read.
FORMAT_VERSION = 2  # 2: a block's snapshot is its own entry (snapshot thinning)

def pair_fingerprint(pair: Pair, block_tokens: int) -> str:
    """A hex digest of everything the cached rows depend on: both models (their
    weights: `Pair.identity`), their dtypes and quantization, the layers the
    drafter taps, its context window, the target's rollback room, the backend and
    the block size."""
    facts = {
        "version": FORMAT_VERSION, "backend": backend_name(), "block_tokens": block_tokens, **pair.identity(),
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
