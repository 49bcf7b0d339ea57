"""How many positions a target reads: its config's context, rope scaling included.

The engine needs it (the calibration measures costs at a long context within
it) and so does the plan (`check_context` refuses prompts that fill it).
"""

from typing import Optional

from ...errors import PromptTooLongError

# Rope types whose `factor` stretches the trained length when the config does not
# state it as `original_max_position_embeddings` (dynamic NTK and YaRN read the
# trained length as `max_position_embeddings`, as Hugging Face does).
_STRETCH_TRAINED = ("dynamic", "yarn")
# Rope types mlx-lm applies without scaling (mlx_lm.models.rope_utils; "None": no type given).
_NO_SCALING = ("None", "default", "mrope")


def context_limit(target) -> Optional[int]:
    """The most positions (prompt and generated tokens together) `target` reads,
    from its mlx-lm `ModelArgs`; None when its config states no limit.

    `max_position_embeddings`, or more where the rope scaling states an
    extension: `factor` × `original_max_position_embeddings` (YaRN, Llama 3,
    longrope, dynamic NTK configs that name the trained length), or `factor`
    × `max_position_embeddings` for dynamic NTK and YaRN configs that do not.
    A linear `factor` without the trained length extends nothing: Gemma 3's
    `max_position_embeddings` is already the scaled context.
    """
    args = getattr(target, "args", None)
    trained = _positive(getattr(args, "max_position_embeddings", None))
    scaling = getattr(args, "rope_scaling", None) or getattr(args, "rope_parameters", None)
    extended = None
    kind = str(scaling.get("rope_type") or scaling.get("type")) if isinstance(scaling, dict) else "None"
    if kind not in _NO_SCALING:
        factor = scaling.get("factor")
        factor = float(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else 1.0
        original = _positive(scaling.get("original_max_position_embeddings"))
        if original is not None:
            extended = int(original * max(factor, 1.0))
        elif trained is not None and factor > 1 and kind in _STRETCH_TRAINED:
            extended = int(trained * factor)
    known = [n for n in (trained, extended) if n is not None]
    return max(known) if known else None


def _positive(value) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return int(value)


def check_context(target, prompt_tokens: int, what: str = "the prompt") -> Optional[int]:
    """The tokens that can still be generated after `prompt_tokens` (every token
    the target will have read before answering, earlier turns included); None
    when the target states no limit. Raises `PromptTooLongError` when the
    prompt leaves no room for even one."""
    limit = context_limit(target)
    if limit is None:
        return None
    if prompt_tokens >= limit:
        where = "over" if prompt_tokens > limit else "all of"
        raise PromptTooLongError(
            f"{what} has {prompt_tokens:,} tokens, {where} this model's context of {limit:,} tokens (prompt and "
            f"answer together): shorten it, or use a model with a longer context", prompt_tokens, limit)
    return limit - prompt_tokens
