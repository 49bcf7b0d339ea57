"""Turn user text into prompt token ids, through the chat template when there is one."""

from typing import Optional

from ..errors import DFlashError


# What a measurement reads when there is no conversation yet (a calibration, the exactness
# probe, the doctor's self-test): the first of the built-in code prompts (tools/suites.py).
PROBE_TEXT = "Write a Python function that returns the n-th Fibonacci number iteratively."


def probe_prompt(tokenizer) -> list[int]:
    """`PROBE_TEXT` as the model reads it (its chat template applied)."""
    return build_prompt(tokenizer, PROBE_TEXT)


def build_prompt(
    tokenizer,
    text: str,
    system_prompt: Optional[str] = None,
    use_chat_template: bool = True,
    template_kwargs: Optional[dict] = None,
    history: Optional[list[dict]] = None,
) -> list[int]:
    """Token ids for `text`; with a template, `history` + this user turn."""
    if not text or not text.strip():
        raise DFlashError("the prompt is empty: give some text (or '-' to read stdin)")
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = list(history or [])
        if system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": text})
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
        )
        return list(tokenizer.encode(rendered, add_special_tokens=False))
    if system_prompt:
        text = f"{system_prompt}\n\n{text}"
    return list(tokenizer.encode(text))


def render_conversation(
    tokenizer,
    messages: list[dict],
    *,
    system_prompt: Optional[str] = None,
    use_chat_template: bool = True,
    template_kwargs: Optional[dict] = None,
    tools: Optional[list] = None,
) -> tuple[str, bool]:
    """(text, templated): the conversation as the model reads it, ending with
    the assistant's cue. With a chat template, `tools` and `template_kwargs` go
    to it; without one the turns are one running text, `dflash2 chat`'s and
    `dflash2 serve`'s alike (a leading system message stands for `system_prompt`)."""
    if messages and messages[0]["role"] == "system" and system_prompt is None:
        system_prompt, messages = messages[0]["content"], messages[1:]
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        full = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + list(messages)
        kwargs = dict(template_kwargs or {})
        if tools:
            kwargs["tools"] = tools
        return tokenizer.apply_chat_template(full, tokenize=False, add_generation_prompt=True, **kwargs), True
    parts = [system_prompt + "\n\n"] if system_prompt else []
    for m in messages:
        parts.append(("\n" if m["role"] == "user" and parts else "") + m["content"])
    return "".join(parts), False
