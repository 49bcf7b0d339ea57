"""How many positions the target can read, and the one check every path makes before prefill.

`stream_generate`, `ChatSession` and the server's service all call
`check_context` with the whole context a request reaches (earlier turns
included) before any token runs through the target. As llama.cpp does with
n_ctx: a prompt that fills the context is refused in one line, and a
generation stops when the context is full (finish reason "length", as at
max_tokens), so nothing reads positions past what the model was trained (or
scaled) to read. (Refusing prompt + max_tokens over the context, as the
OpenAI API does, would refuse `-m 100000`, the usual "until it ends".)
"""

from typing import Optional

from ..errors import PromptTooLongError

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
