"""/v1/models: the served names, in OpenAI's shape and Anthropic's at once (both SDKs list them)."""

from datetime import datetime, timezone
from typing import Optional


def models_list(names, created: int, context: Optional[int] = None) -> dict:
    """OpenAI's list and Anthropic's page (has_more, first_id, last_id) in one object."""
    names = list(names)
    return {"object": "list", "data": [model_card(name, created, context) for name in names], "has_more": False,
            "first_id": names[0] if names else None, "last_id": names[-1] if names else None}


def model_card(model_id: str, created: int, context: Optional[int] = None) -> dict:
    """A model in OpenAI's shape (object, created, owned_by) and Anthropic's (type, display_name,
    created_at), with its context in tokens as vLLM says it (`max_model_len`) where it has one:
    what `dflash2 launch` tells an agent client its window is."""
    stamp = datetime.fromtimestamp(created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    card = {"id": model_id, "object": "model", "created": created, "owned_by": "dflash2-mlx",
            "type": "model", "display_name": model_id, "created_at": stamp}
    return {**card, "max_model_len": context} if context else card
