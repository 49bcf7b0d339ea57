"""Prompt caches kept across requests, reused by longest common token prefix.

Each entry is a `DecodeCache` (target and drafter caches, recurrent states
included) holding one earlier conversation. A new request takes the entry that
shares the longest prefix of token ids with its prompt, rewinds it to that
prefix and prefills only the rest. Entries are bounded in bytes and evicted
least recently used first. Only the service's worker thread touches the pool.
"""

from collections import OrderedDict
from typing import Callable

from ...engine.decode.loop import DecodeCache


def cache_nbytes(cache: DecodeCache) -> int:
    """Bytes the entry's caches hold (allocated, not just the filled rows)."""
    total = 0 if cache.unread is None else cache.unread.nbytes
    for layers in (cache.target, cache.drafter):
        for c in layers or []:
            n = getattr(c, "nbytes", 0)
            total += int(n() if callable(n) else n)
    return total


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCachePool:
    def __init__(self, max_bytes: int, new_cache: Callable[[], DecodeCache]):
        self.max_bytes = max_bytes
        self._new = new_cache
        self._entries: "OrderedDict[int, DecodeCache]" = OrderedDict()  # oldest first
        self._bytes: dict[int, int] = {}
        self._next_id = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        return sum(self._bytes.values())

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: list[int]) -> int:
        """Tokens of `ids` the best entry shares (0: none); takes nothing."""
        return max((common_prefix(cache.tokens, ids) for cache in self._entries.values()), default=0)

    def take(self, ids: list[int]) -> tuple[DecodeCache, int]:
        """(cache, reused): a cache holding the first `reused` ids of the prompt
        (all but the last of them already run), or a fresh one with 0.

        The entry leaves the pool while it is in use; `put` returns it."""
        best, best_n = None, 0
        for key, cache in self._entries.items():
            n = common_prefix(cache.tokens, ids)
            if n > best_n:
                best, best_n = key, n
        if best is None:
            self.misses += 1
            return self._new(), 0
        cache = self._entries.pop(best)
        del self._bytes[best]
        cache.truncate(best_n)
        if cache.stale:
            # Recurrent state cannot be rewound into the middle of what it read:
            # this conversation must be read again from the start.
            self.misses += 1
            return self._new(), 0
        self.hits += 1
        return cache, best_n

    def put(self, cache: DecodeCache) -> None:
        """Keep `cache` (most recently used) and evict down to the byte bound."""
        if cache.stale or not cache.tokens or self.max_bytes <= 0:
            return
        key, self._next_id = self._next_id, self._next_id + 1
        self._entries[key] = cache
        self._bytes[key] = cache_nbytes(cache)
        while self._entries and self.nbytes > self.max_bytes:
            old, _ = self._entries.popitem(last=False)
            del self._bytes[old]
            self.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self._bytes.clear()
