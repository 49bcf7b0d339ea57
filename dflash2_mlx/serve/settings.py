"""Server-wide settings the protocol layers read (the CLI fills them from flags)."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ServeSettings:
    model_id: str  # the name /v1/models lists and requests must use (or omit)
    api_key: Optional[str] = None  # None: no authentication (loopback only, unless opened on purpose)
    max_prompt_tokens: Optional[int] = None  # None: the target's context alone bounds a prompt
    default_max_tokens: int = 512
    max_body_bytes: int = 8 * 1024 * 1024
    template_kwargs: dict = field(default_factory=dict)  # defaults under each request's chat_template_kwargs
