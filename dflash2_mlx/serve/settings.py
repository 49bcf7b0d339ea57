"""Server-wide settings the protocol layers read (the CLI fills them from flags)."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ServeSettings:
    model_id: str  # the name responses carry, first in /v1/models
    api_key: Optional[str] = None  # None: no authentication (loopback only, unless opened on purpose)
    max_prompt_tokens: Optional[int] = None  # None: the target's context alone bounds a prompt
    default_max_tokens: int = 512
    max_body_bytes: int = 8 * 1024 * 1024
    template_kwargs: dict = field(default_factory=dict)  # defaults under each request's chat_template_kwargs
    # More names /v1/models lists. Any `model` a request names is answered by the one loaded pair
    # (agents ask for `claude-…`, `gpt-4o` or a "small fast model"), unless `strict_model_names`.
    aliases: tuple[str, ...] = ()
    strict_model_names: bool = False

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.model_id, *(a for a in self.aliases if a != self.model_id))
