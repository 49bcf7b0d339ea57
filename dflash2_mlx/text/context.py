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

from ..engine.target.context import context_limit
from ..errors import PromptTooLongError

__all__ = ["check_context", "context_limit"]


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
