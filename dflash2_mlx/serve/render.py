"""Messages to prompt ids, and the model's thinking apart from its answer.

A target with a chat template renders the messages (with `tools` and the
template's keyword arguments); one without gets the running text `dflash2
chat` uses. The prompt is always rendered and encoded whole, never pieced
together from cached answer tokens, so a request reads the same ids whether
or not the prompt cache holds part of it, and its output is the same.
"""

from typing import Optional

from ..text.prompt import render_conversation
from .errors import ApiError


def conversation_ids(tokenizer, messages: list[dict], *, tools: Optional[list] = None,
                     template_kwargs: Optional[dict] = None) -> tuple[list[int], str]:
    """(prompt ids, rendered text) for a conversation ending with the assistant's cue."""
    try:
        text, templated = render_conversation(tokenizer, messages, tools=tools, template_kwargs=template_kwargs)
    except ApiError:
        raise
    except Exception as e:  # jinja's TemplateError, or a template that rejects the messages
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ApiError(400, f"the chat template could not render these messages: {first}", "messages") from None
    ids = tokenizer.encode(text, add_special_tokens=False) if templated else tokenizer.encode(text)
    return list(ids), text


def think_tags(tokenizer) -> tuple[Optional[str], Optional[str]]:
    """The target's think tags (as mlx-lm finds them), or (None, None)."""
    if not getattr(tokenizer, "has_thinking", False):
        return None, None
    return tokenizer.think_start, tokenizer.think_end


def starts_thinking(prompt_text: str, start: Optional[str], end: Optional[str]) -> bool:
    """Templates that open the think block in the prompt (the answer begins inside it)."""
    if not start:
        return False
    return prompt_text.rfind(start) > prompt_text.rfind(end)


class ReasoningSplitter:
    """Routes streamed text inside the think tags to reasoning, the rest to
    content (as mlx-lm's server and vLLM fill `reasoning_content`). Text that
    could be the start of a tag is held back until it is decided."""

    def __init__(self, start: Optional[str], end: Optional[str], thinking: bool = False):
        self.start, self.end = start, end
        self.thinking = thinking and bool(start)
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) for this text."""
        if not self.start:
            return "", text
        reasoning, content = [], []
        held = self._held + text
        while held:
            tag = self.end if self.thinking else self.start
            at = held.find(tag)
            if at >= 0:
                (reasoning if self.thinking else content).append(held[:at])
                held = held[at + len(tag):]
                self.thinking = not self.thinking
                continue
            keep = partial_suffix(held, tag)
            (reasoning if self.thinking else content).append(held[: len(held) - keep])
            held = held[len(held) - keep:]
            break
        self._held = held
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held, "") if self.thinking else ("", held)


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
