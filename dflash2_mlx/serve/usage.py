"""The speculative figures every protocol adds to its usage object."""

from typing import Optional

from ..text.stats import GenerationStats


def speculative_usage(stats: Optional[GenerationStats]) -> Optional[dict]:
    """τ, target passes and acceptance by draft position (None when the
    generation was cut off before its final statistics)."""
    if stats is None:
        return None
    return {
        "mode": stats.mode,
        "block_size": stats.block_size,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "target_passes": stats.target_passes,
        "acceptance_by_position": stats.acceptance_by_position,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "prompt_tps": stats.prompt_tps,
        "generation_tps": stats.generation_tps,
    }
