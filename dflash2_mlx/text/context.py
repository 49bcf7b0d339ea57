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

from ..engine.target.context import check_context, context_limit

__all__ = ["check_context", "context_limit"]
