"""Turn user text into prompt token ids, through the chat template when there is one."""

from typing import Optional

from ..errors import DFlashError


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
