"""How many sequences fit: the default `--max-batch` from the memory their caches need."""

import os
from typing import Optional

import mlx.core as mx

from ..pair import Pair
from ..target.context import context_limit

# At most this many sequences by default (the benchmark's top client count), and the share
# of the machine's memory their caches may take at a full default context.
DEFAULT_MOST, MEMORY_SHARE, DEFAULT_CONTEXT = 8, 0.25, 4096


def machine_memory() -> Optional[int]:
    """Bytes of memory the device can use: the GPU's working set on Metal, else the machine's RAM."""
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    for key in ("max_recommended_working_set_size", "memory_size"):
        if info.get(key):
            return int(info[key])
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def sequence_cache_bytes(pair: Pair, context: int) -> int:
    """Bytes of one sequence's target and drafter KV caches at `context` tokens
    (sliding layers hold their window, recurrent ones a fixed state, counted as none)."""
    args = pair.target.args
    heads = getattr(args, "num_key_value_heads", None) or args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    width = pair.target.activation_dtype.size
    total = 2 * heads * head_dim * width * context * pair.target.num_layers
    drafter = pair.drafter
    if drafter is not None:
        c = drafter.config
        total += 2 * c.num_key_value_heads * c.head_dim * drafter.activation_dtype.size * context * len(drafter.layers)
    return total


def default_max_batch(pair: Pair, memory: Optional[int] = None) -> int:
    """The sequences whose caches, at the target's context (at most DEFAULT_CONTEXT
    tokens each), fit in MEMORY_SHARE of `memory`; between 1 and DEFAULT_MOST."""
    memory = memory if memory is not None else machine_memory()
    if not memory:
        return 1
    context = min(context_limit(pair.target) or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
    per_sequence = max(sequence_cache_bytes(pair, context), 1)
    return max(1, min(DEFAULT_MOST, int(memory * MEMORY_SHARE // per_sequence)))
