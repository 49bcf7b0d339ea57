"""The prompt cache: blocks in memory and on disk, and conversation tails.

A request's prompt is cut into blocks of `block_tokens` ids, keyed by a hash
chain (keys.py). `take` finds the longest run of the prompt's blocks held in
memory or on disk and rebuilds the caches from it, or takes a conversation
tail (live.py: an earlier request's caches, token-exact, answer included)
when that reaches further. `extend` runs the prompt's remaining whole blocks
through the target and the drafter, keeping each block as it completes, so a
later prompt that shares them (a system prompt, an earlier turn, a branch)
starts from there. `put` keeps the request's caches as a tail and its blocks.
Disk writes wait in `pending` until `flush`, so they never delay an answer.
Only one thread (the service's worker, or the chat) uses a cache.
"""

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from ...engine.decode.loop import DecodeCache, prefill
from ...engine.pair import Pair
from .disk import DiskTier
from .keys import block_keys, pair_fingerprint
from .layers import NotStorable, can_restore, capture, cuts_into_rows, layers_of, parts_nbytes, restore
from .live import PromptCachePool

DEFAULT_BLOCK_TOKENS = 256


@dataclass(frozen=True)
class CacheSettings:
    """How much the prompt cache keeps. `memory_bytes` bounds the blocks in
    memory and, apart, the conversation tails; 0 turns memory caching off."""

    memory_bytes: int = 4 << 30
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    folder: Optional[Path] = None  # the disk tier; None: memory only
    disk_bytes: int = 16 << 30


@dataclass(frozen=True)
class Reuse:
    """Where the prompt tokens a request did not run came from."""

    tokens: int = 0  # prompt tokens not run again (memory + disk)
    disk: int = 0  # of those, read from disk

    @property
    def memory(self) -> int:
        return self.tokens - self.disk


@dataclass
class _Block:
    tokens: tuple
    parts: list
    nbytes: int


def still_to_run(cache: DecodeCache, ids: list[int]) -> list[int]:
    """The part of prompt `ids` that `cache` has not run: from its last committed token on."""
    return list(ids[len(cache.tokens) - 1 :]) if cache.tokens else list(ids)


class PromptCache:
    """Blocks (memory, then disk) and conversation tails for one pair."""

    def __init__(self, pair: Pair, settings: CacheSettings = CacheSettings(),
                 warn: Callable[[str], None] = lambda line: None):
        self.pair, self.settings, self.warn = pair, settings, warn
        self.S = settings.block_tokens
        self.fingerprint = pair_fingerprint(pair, self.S)
        self.live = PromptCachePool(settings.memory_bytes, self.new_cache)
        self._blocks: "OrderedDict[str, _Block]" = OrderedDict()  # oldest use first
        # Kept as a count, not summed: /metrics reads it from another thread.
        self.block_bytes = 0
        self.memory_hits = 0  # blocks reused from memory, and from disk (disk.hits)
        self.pending: "OrderedDict[str, _Block]" = OrderedDict()  # blocks not yet on disk
        self.disk = (DiskTier(settings.folder, settings.disk_bytes, self.fingerprint, warn)
                     if settings.folder is not None else None)

    def new_cache(self) -> DecodeCache:
        pair = self.pair
        return DecodeCache(pair.target.make_cache(), pair.drafter.make_cache() if pair.drafter is not None else None)

    # -- sizes (/metrics) -----------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held in memory (blocks and conversation tails)."""
        return self.block_bytes + self.live.nbytes

    def __len__(self) -> int:
        return len(self._blocks) + len(self.live)

    # -- a request --------------------------------------------------------------------
    def take(self, ids: list[int]) -> tuple[DecodeCache, Reuse]:
        """Caches holding the longest cached prefix of `ids` (all but its last
        token run), and where it came from; fresh caches when none is held.
        At least one prompt token is always left to run."""
        keys = block_keys(self.fingerprint, ids[:-1], self.S)
        held = self._held(keys)
        if self.live.longest(ids) > held * self.S + 1:
            cache, reused = self.live.take(ids)
            if reused:
                return cache, Reuse(reused - 1)
        cache = self.new_cache()
        parts, disk = [], 0
        for k, key in enumerate(keys[:held]):
            block, from_disk = self._get(key, ids[k * self.S : (k + 1) * self.S])
            if block is None:
                break
            disk += from_disk
            self._remember(key, block)  # read from disk: kept in memory too
            parts.append(block.parts)
        self._trim_memory()
        if not parts or not can_restore(cache, parts):
            return cache, Reuse()
        restore(cache, parts)
        n = len(parts) * self.S
        cache.tokens = list(ids[: n + 1])
        self.memory_hits += len(parts) - disk
        return cache, Reuse(n, disk * self.S)

    def prepare(self, ids: list[int], prefill_step_size: Optional[int] = None,
                progress: Optional[Callable[[int, int], None]] = None) -> tuple[DecodeCache, list[int], Reuse]:
        """`take`, then `extend`: (caches, the prompt still to run, reuse). Pass
        the prompt to `stream_generate` with `prompt_cache=` the caches, then
        `put` them back (and `flush` when idle)."""
        cache, reuse = self.take(ids)
        self.extend(cache, ids, prefill_step_size, progress)
        return cache, still_to_run(cache, ids), reuse

    def _held(self, keys: list[str]) -> int:
        """How many leading blocks are in memory or on disk (disk files not yet read)."""
        n = 0
        for key in keys:
            if key not in self._blocks and key not in self.pending and (self.disk is None or key not in self.disk):
                break
            n += 1
        return n

    def _get(self, key: str, tokens) -> tuple[Optional[_Block], bool]:
        """(the block, whether it was read from disk); None when not held."""
        block = self._blocks.get(key) or self.pending.get(key)
        if block is not None:
            return (block if block.tokens == tuple(tokens) else None), False
        parts = self.disk.load(key, tokens) if self.disk is not None else None
        return (None if parts is None else _Block(tuple(tokens), parts, parts_nbytes(parts))), True

    def extend(self, cache: DecodeCache, ids: list[int], prefill_step_size: Optional[int] = None,
               progress: Optional[Callable[[int, int], None]] = None, max_blocks: Optional[int] = None) -> bool:
        """Run the whole blocks of `ids` that `cache` does not hold yet (leaving
        at least one token to run), keeping each as a block. `progress(done,
        total)` counts the tokens run here out of those the prompt still needs.
        `max_blocks`: run at most that many now (a batch runs other sequences'
        cycles in between); returns whether whole blocks are left to run."""
        keys = block_keys(self.fingerprint, ids[:-1], self.S)
        ran = start = max(len(cache.tokens) - 1, 0)
        if cache.stale or cache.tokens != list(ids[: len(cache.tokens)]):
            return False
        rows_only, blocks_run = all(map(cuts_into_rows, layers_of(cache))), 0
        for k in range(ran // self.S, len(keys)):
            end = (k + 1) * self.S
            if end > ran:
                if max_blocks is not None and blocks_run >= max_blocks:
                    return True
                blocks_run += 1
                # The loop's own prefill, so the rows equal those of an uncached run.
                prefill(mx.array(ids[ran:end], dtype=mx.int32), self.pair, cache, prefill_step_size)
                ran = end
                cache.tokens = list(ids[: end + 1])
                cache.last_verify = None
                if progress is not None:
                    progress(ran - start, len(ids) - start)
            if rows_only or end == ran:  # a snapshot layer can only be read where it stands
                self._keep(keys[k], ids[k * self.S : end], cache, k * self.S, end)
        return False

    def put(self, cache: DecodeCache) -> None:
        """Keep `cache` as a conversation tail (the cache now belongs here) and
        its whole blocks that every layer can still cut out."""
        self.keep_blocks(cache)
        self.live.put(cache)

    def keep_blocks(self, cache: DecodeCache) -> None:
        """Keep the whole blocks of `cache` not yet kept; only layers that keep
        rows can give earlier blocks, so others give none (their blocks were
        kept by `extend` as the prompt ran)."""
        if cache.stale or not cache.tokens:
            return
        ran = len(cache.tokens) - 1
        if any(l.offset != ran for l in layers_of(cache)):
            return
        ids = cache.tokens
        keys = block_keys(self.fingerprint, ids[:ran], self.S)
        rows_only = all(map(cuts_into_rows, layers_of(cache)))
        for k, key in enumerate(keys):
            end = (k + 1) * self.S
            if rows_only or end == ran:
                self._keep(key, ids[k * self.S : end], cache, k * self.S, end)

    def _keep(self, key: str, tokens, cache: DecodeCache, start: int, end: int) -> None:
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return
        if self.settings.memory_bytes <= 0 and self.disk is None:
            return
        try:
            parts = capture(cache, start, end)
        except NotStorable as e:
            self.warn(f"prompt cache: this pair's caches cannot be stored in blocks ({e})")
            return
        mx.eval([p for part in parts for p in part.values() if isinstance(p, mx.array)])
        block = _Block(tuple(tokens), parts, parts_nbytes(parts))
        self._remember(key, block)
        if self.disk is not None and key not in self.disk:
            self.pending[key] = block
        self._trim_memory()

    def _remember(self, key: str, block: _Block) -> None:
        if key not in self._blocks:
            self._blocks[key] = block
            self.block_bytes += block.nbytes
        self._blocks.move_to_end(key)

    def _trim_memory(self) -> None:
        while self._blocks and self.block_bytes > self.settings.memory_bytes:
            _, old = self._blocks.popitem(last=False)
            self.block_bytes -= old.nbytes

    def flush(self) -> None:
        """Write the blocks waiting for the disk tier (call between requests)."""
        while self.pending:
            key, block = self.pending.popitem(last=False)
            self.disk.save(key, block.tokens, block.parts)

    def stats(self) -> dict:
        """Hits and bytes by tier (what /metrics shows)."""
        return {"memory_hits": self.memory_hits, "memory_bytes": self.nbytes, "memory_blocks": len(self._blocks),
                "disk_hits": self.disk.hits if self.disk else 0, "disk_bytes": self.disk.nbytes if self.disk else 0,
                "disk_writes": self.disk.writes if self.disk else 0,
                "disk_skipped": self.disk.skipped if self.disk else 0}
