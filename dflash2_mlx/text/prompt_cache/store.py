"""The prompt cache: blocks in memory and on disk, and conversation tails.

A request's prompt is cut into blocks of `block_tokens` ids, keyed by a hash
chain (keys.py). `take` finds the longest run of the prompt's blocks held in
memory or on disk and rebuilds the caches from it, or takes a conversation
tail (live.py: an earlier request's caches, token-exact, answer included)
when that reaches further. `extend` runs the prompt's remaining whole blocks
through the target and the drafter, keeping each block as it completes, so a
later prompt that shares them (a system prompt, an earlier turn, a branch)
starts from there. `put` keeps the request's caches as a tail and its blocks.

Layers that keep snapshots (recurrent state, window rings) keep one only
every `snapshot_every` blocks and at the end of each prompt; a prefix resumes
at the last block with a snapshot and runs the rows after it again.

New blocks go to disk on the writer's thread (writer.py): they wait in
`pending` (still readable) until written, and `flush` waits for the writes.
Only one thread (the service's worker, or the chat) uses a cache.

(Past 300 lines: the tiers, the tails and the writer's hand-off meet here;
the file format, the layers and the writer itself live apart.)
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from ...engine.decode.loop import DecodeCache, prefill
from ...engine.pair import Pair
from .disk import DiskTier, Write
from .keys import block_keys, pair_fingerprint
from .layers import (ROWS, SNAPSHOT, NotStorable, can_restore, capture, cuts_into_rows, has_snapshots,
                     layers_of, merge, parts_nbytes, restore)
from .live import PromptCachePool
from .writer import DiskWriter

DEFAULT_BLOCK_TOKENS = 256
# Measured on the qwen3_5 look-alike (docs/prompt-cache.md): see there for why 4.
DEFAULT_SNAPSHOT_EVERY = 4


@dataclass(frozen=True)
class CacheSettings:
    """How much the prompt cache keeps. `memory_bytes` bounds the blocks in
    memory and, apart, the conversation tails; 0 turns memory caching off."""

    memory_bytes: int = 4 << 30
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    folder: Optional[Path] = None  # the disk tier; None: memory only
    disk_bytes: int = 16 << 30
    # Recurrent and window layers: a snapshot every this many blocks (and at each prompt's end).
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY


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


def snapshot_key(key: str) -> str:
    """The key (and file name) of block `key`'s snapshot entry."""
    return f"{key}-snapshot"


def still_to_run(cache: DecodeCache, ids: list[int]) -> list[int]:
    """The part of prompt `ids` that `cache` has not run: from its last committed token on."""
    return list(ids[len(cache.tokens) - 1 :]) if cache.tokens else list(ids)


class PromptCache:
    """Blocks (memory, then disk) and conversation tails for one pair."""

    def __init__(self, pair: Pair, settings: CacheSettings = CacheSettings(),
                 warn: Callable[[str], None] = lambda line: None):
        if settings.snapshot_every < 1:
            raise ValueError(f"snapshot_every {settings.snapshot_every} must be at least 1")
        self.pair, self.settings, self.warn = pair, settings, warn
        self.S = settings.block_tokens
        self.fingerprint = pair_fingerprint(pair, self.S)
        self.live = PromptCachePool(settings.memory_bytes, self.new_cache)
        self.snapshots = has_snapshots(self.new_cache())  # else every block is a prefix end
        self._blocks: "OrderedDict[str, _Block]" = OrderedDict()  # entries, oldest use first
        # Kept as a count, not summed: /metrics reads it from another thread.
        self.block_bytes = 0
        self.memory_hits = 0  # blocks reused from memory, and from disk (disk.hits)
        self.pending: dict[str, _Block] = {}  # handed to the writer, not yet written
        self._outbox: list = []  # (written key or None, warning line or None) from the writer
        self._outbox_lock = threading.Lock()
        self.disk = self.writer = None
        if settings.folder is not None:
            self.disk = DiskTier(settings.folder, settings.disk_bytes, self.fingerprint, warn)
            self.writer = DiskWriter(self._write, lambda line: self._post(None, line))

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
        self._collect()
        keys = block_keys(self.fingerprint, ids[:-1], self.S)
        usable = self._usable(keys)
        if self.live.longest(ids) > usable * self.S + 1:
            cache, reused = self.live.take(ids)
            if reused:
                return cache, Reuse(reused - 1)
        cache = self.new_cache()
        parts, from_disk = self._load(keys, ids, usable)
        self._trim_memory()
        if not parts or not can_restore(cache, parts):
            return cache, Reuse()
        restore(cache, parts)
        n = len(parts) * self.S
        cache.tokens = list(ids[: n + 1])
        disk = sum(from_disk)
        self.memory_hits += len(parts) - disk
        return cache, Reuse(n, disk * self.S)

    def prepare(self, ids: list[int], prefill_step_size: Optional[int] = None,
                progress: Optional[Callable[[int, int], None]] = None) -> tuple[DecodeCache, list[int], Reuse]:
        """`take`, then `extend`: (caches, the prompt still to run, reuse). Pass
        the prompt to `stream_generate` with `prompt_cache=` the caches, then
        `put` them back."""
        cache, reuse = self.take(ids)
        self.extend(cache, ids, prefill_step_size, progress)
        return cache, still_to_run(cache, ids), reuse

    def _holds(self, key: str) -> bool:
        return key in self._blocks or key in self.pending or (self.disk is not None and key in self.disk)

    def _usable(self, keys: list[str]) -> int:
        """How many leading blocks a prefix can reuse without reading a file:
        their rows are held, and the last one's snapshot where layers need one."""
        n = 0
        while n < len(keys) and self._holds(keys[n]):
            n += 1
        while self.snapshots and n and not self._holds(snapshot_key(keys[n - 1])):
            n -= 1
        return n

    def _load(self, keys: list[str], ids: list[int], n: int) -> tuple[list, list]:
        """(each block's parts, the last one whole; whether each came from disk)
        for the longest prefix of the first `n` blocks that reads back."""
        parts, from_disk = [], []
        for k in range(n):
            block, disk = self._get(keys[k], ids[k * self.S : (k + 1) * self.S])
            if block is None:
                break
            self._remember(keys[k], block)  # read from disk: kept in memory too
            parts.append(block.parts)
            from_disk.append(disk)
        while self.snapshots and parts:  # the prefix ends at a block whose snapshot reads back
            k = len(parts) - 1
            snap, disk = self._get(snapshot_key(keys[k]), ids[k * self.S : (k + 1) * self.S])
            if snap is not None:
                self._remember(snapshot_key(keys[k]), snap)
                parts[-1], from_disk[-1] = merge(parts[-1], snap.parts), from_disk[-1] or disk
                break
            parts.pop()
            from_disk.pop()
        return parts, from_disk

    def _get(self, key: str, tokens) -> tuple[Optional[_Block], bool]:
        """(the entry, whether it was read from disk); None when not held."""
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
        self._collect()
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
                # A snapshot every few blocks, and always at the prompt's end (where a next turn resumes).
                snap = (k + 1) % self.settings.snapshot_every == 0 or k == len(keys) - 1
                self._keep(keys[k], ids[k * self.S : end], cache, k * self.S, end, snap)
        return False

    def put(self, cache: DecodeCache) -> None:
        """Keep `cache` as a conversation tail (the cache now belongs here) and
        its whole blocks that every layer can still cut out."""
        self.keep_blocks(cache)
        self.live.put(cache)

    def keep_blocks(self, cache: DecodeCache) -> None:
        """Keep the whole blocks of `cache` not yet kept; only layers that keep
        rows can give earlier blocks, so others give only the block ending
        where the caches stand (with its snapshot)."""
        self._collect()
        if not cache.at_rest:
            return
        ran = len(cache.tokens) - 1
        ids = cache.tokens
        keys = block_keys(self.fingerprint, ids[:ran], self.S)
        rows_only = all(map(cuts_into_rows, layers_of(cache)))
        for k, key in enumerate(keys):
            end = (k + 1) * self.S
            if rows_only or end == ran:
                self._keep(key, ids[k * self.S : end], cache, k * self.S, end, snapshot=True)

    def _keep(self, key: str, tokens, cache: DecodeCache, start: int, end: int, snapshot: bool) -> None:
        if self.settings.memory_bytes <= 0 and self.disk is None:
            return
        self._keep_entry(key, tokens, cache, start, end, ROWS)
        if snapshot and self.snapshots:
            self._keep_entry(snapshot_key(key), tokens, cache, start, end, SNAPSHOT)

    def _keep_entry(self, key: str, tokens, cache: DecodeCache, start: int, end: int, entry: str) -> None:
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return
        if key in self.pending:
            return
        if cache.unread is not None and cache.drafter[0].offset < end:  # a block keeps drafter rows: run them in
            cache.catch_up(self.pair.drafter)
        try:
            parts = capture(cache, start, end, entry)
        except NotStorable as e:
            self.warn(f"prompt cache: this pair's caches cannot be stored in blocks ({e})")
            return
        mx.eval([p for part in parts for p in part.values() if isinstance(p, mx.array)])
        block = _Block(tuple(tokens), parts, parts_nbytes(parts))
        self._remember(key, block)
        if self.disk is not None and key not in self.disk:
            job = self.disk.prepare(key, tokens, parts)  # evaluated and copied out here, on the owner's thread
            if job is not None:
                self.pending[key] = block
                self.writer.submit(job, job.nbytes)
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

    # -- the writer ------------------------------------------------------------------
    def _write(self, job: Write) -> None:
        """On the writer's thread: one block to disk (no MLX here)."""
        line = None
        try:
            line = self.disk.write(job)
        finally:
            self._post(job.key, line)

    def _post(self, key: Optional[str], line: Optional[str]) -> None:
        with self._outbox_lock:
            self._outbox.append((key, line))

    def _collect(self) -> None:
        """On the owner's thread: forget written blocks' pending copies, say the writer's lines."""
        with self._outbox_lock:
            done, self._outbox = self._outbox, []
        for key, line in done:
            if key is not None:
                self.pending.pop(key, None)
            if line:
                self.warn(line)

    def flush(self) -> None:
        """Wait until every new block is on disk (or has failed with one line)."""
        if self.writer is not None:
            self.writer.flush()
        self._collect()

    def close(self) -> None:
        """`flush`, then end the writer's thread (at shutdown)."""
        if self.writer is not None:
            self.writer.close()
        self._collect()

    def stats(self) -> dict:
        """Hits and bytes by tier (what /metrics shows)."""
        return {"memory_hits": self.memory_hits, "memory_bytes": self.nbytes, "memory_blocks": len(self._blocks),
                "disk_hits": self.disk.hits if self.disk else 0, "disk_bytes": self.disk.nbytes if self.disk else 0,
                "disk_writes": self.disk.writes if self.disk else 0,
                "disk_skipped": self.disk.skipped if self.disk else 0}
