"""The conversation tails of the prompt cache (moved to `text.prompt_cache.live`,
where the block store and `dflash2 chat` reach them too)."""

from ..text.prompt_cache.live import PromptCachePool, cache_nbytes, common_prefix

__all__ = ["PromptCachePool", "cache_nbytes", "common_prefix"]
