"""The speculative figures every protocol adds to its usage object."""

from typing import Optional

from ..text.stats import GenerationStats


def cache_usage(cached_tokens: int, cached_disk: int) -> dict:
    """Where the cached prompt tokens came from: the memory tier (blocks and
    conversation tails) or the disk tier (docs/prompt-cache.md)."""
    return {"memory_tokens": cached_tokens - cached_disk, "disk_tokens": cached_disk}


def batch_usage(finished) -> dict:
    """The batch a request ran in (docs/batching.md): `size`, the most requests that
    shared a target pass with it (itself included); `max_batch`, the server's; `note`,
    why it ran alone on a server asked to batch (its target's caches cannot batch yet)."""
    out = {"size": finished.batch, "max_batch": finished.max_batch}
    if finished.batch_note:
        out["note"] = finished.batch_note
    return out


def speculative_usage(stats: Optional[GenerationStats]) -> Optional[dict]:
    """τ, target passes and acceptance by draft position (None when the
    generation was cut off before its final statistics). With --block-size
    auto, `block_size` is the largest block auto may choose and `block_sizes`
    the cycles it ran at each size (1: a plain step)."""
    if stats is None:
        return None
    return {
        "mode": stats.mode,
        "block_size": stats.block_size,
        "block_policy": stats.block_policy,
        "block_sizes": {str(B): n for B, n in sorted(stats.block_sizes.items())} if stats.block_sizes else None,
        "tree_rows": stats.tree_rows,
        "verify_rows": stats.verify_rows,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "target_passes": stats.target_passes,
        "acceptance_by_position": stats.acceptance_by_position,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "prompt_tps": stats.prompt_tps,
        "generation_tps": stats.generation_tps,
    }
