"""A prompt cache in blocks, in memory and on disk (docs/prompt-cache.md)."""

from .store import CacheSettings, PromptCache, Reuse, still_to_run

__all__ = ["CacheSettings", "PromptCache", "Reuse", "still_to_run"]
