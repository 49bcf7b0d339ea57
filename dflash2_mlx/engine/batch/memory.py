"""How many sequences fit: the default `--max-batch` from the memory their caches need."""

from typing import Optional

from ...device import device_memory_bytes
from ..pair import Pair
from ..target.context import context_limit

# At most this many sequences by default (the benchmark's top client count), and the share
# of the machine's memory their caches may take at a full default context.
DEFAULT_MOST, MEMORY_SHARE, DEFAULT_CONTEXT = 8, 0.25, 4096


def sequence_cache_bytes(pair: Pair, context: int) -> int:
    """Bytes of one sequence's target and drafter KV caches at `context` tokens, as if
    every layer kept every row (an upper bound where sliding or recurrent layers keep less)."""
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
    memory = memory if memory is not None else device_memory_bytes()
    if not memory:
        return 1
    context = min(context_limit(pair.target) or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
    per_sequence = max(sequence_cache_bytes(pair, context), 1)
    return max(1, min(DEFAULT_MOST, int(memory * MEMORY_SHARE // per_sequence)))
