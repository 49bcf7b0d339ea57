"""Target caches that can undo a verify forward.

Attention `KVCache`s roll back by trimming. Two layer kinds cannot:

- Sliding-window layers: mlx-lm's `RotatingKVCache` overwrites the oldest row
  once it wraps, so it stops being trimmable. `WindowKVCache` is a ring of
  `window + max_block` rows instead, so the rows a rejected draft overwrote
  were never needed, and `trim(n)` can move back up to `max_block + 1` rows
  at any offset. Absolute position p always lives in slot p % capacity, so a
  query sees its window at the same slots whether the rows arrived one by one
  or as a block (which keeps block verification bitwise equal to stepping).
- Recurrent layers (Gated DeltaNet `ArraysCache`): the state after the last
  row cannot be turned back into the state after an earlier one. The target
  keeps a `RecurrentSnapshot` (the state arrays before verify and the layer
  inputs of the verify rows) and re-runs only the recurrent mixers over the
  accepted rows; `RecurrentCache` is an `ArraysCache` that also counts rows.
"""

from dataclasses import dataclass, field
from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from ..kv_buckets import bucket, grow_buffers, padded_pass
from ..window import window_visible


class RecurrentCache(ArraysCache):
    """An `ArraysCache` that knows how many rows it has seen (`offset`), like
    every other cache, so callers can read the context length from any layer."""

    def __init__(self, size: int):
        super().__init__(size)
        self.offset = 0

    def advance(self, N: int) -> None:
        super().advance(N)
        self.offset += N


@dataclass
class RecurrentSnapshot:
    """What undoing one forward through recurrent layers needs.

    `states[i]` holds layer i's cache arrays and offset before the forward (the
    same array objects: mlx-lm's mixers replace them, never write into them,
    so keeping them costs one state per layer and no copy). `inputs[i]` holds
    the rows that entered layer i during the forward, filled in by it.
    """

    states: dict[int, tuple[list, int]]
    inputs: dict[int, mx.array] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes this snapshot keeps alive beyond the cache itself."""
        state = sum(a.nbytes for arrays, _ in self.states.values() for a in arrays if a is not None)
        return state + sum(x.nbytes for x in self.inputs.values())

    def first(self, rows: int) -> "RecurrentSnapshot":
        """The snapshot of a forward over only the first `rows` of these rows
        (same state before it, shorter inputs)."""
        return RecurrentSnapshot(self.states, {i: x[:, :rows] for i, x in self.inputs.items()})


class WindowKVCache:
    """KV cache of a sliding-window attention layer with room to roll back.

    A ring of `window + max_block` rows. Writes of up to `max_block + 1` rows go
    straight into the ring; longer ones (prefill chunks) attend over the last
    `window - 1` earlier rows concatenated with the new rows, and then keep the
    newest rows in the ring. `make_mask` limits every query to its window, so
    the extra rows are never attended to.
    """

    step = 256

    def __init__(self, window: int, max_block: int):
        if window < 1 or max_block < 1:
            raise ValueError(f"window {window} and max_block {max_block} must be positive")
        self.window = window
        self.max_block = max_block
        self.capacity = window + max_block
        self.keys = None
        self.values = None
        self.offset = 0
        # Highest offset ever written: slots hold position p for every p in
        # [high - capacity, offset); positions in [offset, high) are stale.
        self._high = 0

    # -- sizes --------------------------------------------------------------------
    @property
    def room(self) -> int:
        """Rows this cache can roll back at any offset (`max_block + 1`); also
        the longest write that goes straight through the ring."""
        return self.capacity - self.window + 1

    def _is_long(self, N: int) -> bool:
        return N > self.room

    def _presented(self, end: int, N: int) -> int:
        """Keys a write of N rows ending at position `end` attends over: the ring's
        rows, or, for a multi-row pass while the ring fills, its buffer in whole
        buckets (the empty slots masked off), so the key length changes once per
        bucket rather than every cycle until the ring is full (kv_buckets.py)."""
        K = min(end, self.capacity)
        return min(bucket(K), self.capacity) if padded_pass(N) and not self._is_long(N) else K

    def _reserve(self, rows: int, keys: mx.array, values: mx.array) -> None:
        size = 0 if self.keys is None else self.keys.shape[2]
        if size < rows:
            grow_buffers(self, min(self.capacity, -(-rows // self.step) * self.step), keys, values)

    def _write(self, start: int, keys: mx.array, values: mx.array) -> None:
        """Put rows for positions start.. into their slots (at most one wrap)."""
        S = keys.shape[2]
        slot = start % self.capacity
        first = min(S, self.capacity - slot)
        self.keys[..., slot : slot + first, :] = keys[..., :first, :]
        self.values[..., slot : slot + first, :] = values[..., :first, :]
        if first < S:
            self.keys[..., : S - first, :] = keys[..., first:, :]
            self.values[..., : S - first, :] = values[..., first:, :]

    def _earlier_positions(self, offset: int) -> range:
        return range(offset - min(offset, self.window - 1), offset)

    # -- the mlx-lm cache interface -----------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        o, S = self.offset, keys.shape[2]
        self._reserve(min(o + S, self.capacity), keys, values)
        if self._is_long(S):
            earlier = self._earlier_positions(o)
            if len(earlier):
                slots = mx.array([p % self.capacity for p in earlier])
                out_k = mx.concatenate([mx.take(self.keys, slots, axis=2), keys], axis=2)
                out_v = mx.concatenate([mx.take(self.values, slots, axis=2), values], axis=2)
            else:
                out_k, out_v = keys, values
            m = min(S, self.capacity)
            self._write(o + S - m, keys[..., S - m :, :], values[..., S - m :, :])
        else:
            self._write(o, keys, values)
            out_k = out_v = None
        self.offset = o + S
        self._high = max(self._high, self.offset)
        if out_k is not None:
            return out_k, out_v
        K = self._presented(self.offset, S)
        return self.keys[..., :K, :], self.values[..., :K, :]

    def keys_and_values(self):
        K = min(self.offset, self.capacity)
        return self.keys[..., :K, :], self.values[..., :K, :]

    def key_positions(self, N: int) -> mx.array:
        """Absolute position of each key the next write of N rows attends over."""
        o = self.offset
        if self._is_long(N):
            earlier = self._earlier_positions(o)
            return mx.arange(earlier.start, o + N)
        end = o + N
        s = mx.arange(self._presented(end, N))
        # Slot s holds the newest position <= end - 1 congruent to s; older or stale
        # rows get positions outside every query's window, and so do slots past `end`
        # before the ring has filled (empty, or a bucket's padding).
        held = s + self.capacity * ((end - 1 - s) // self.capacity)
        return held if end >= self.capacity else mx.where(s < end, held, -(2**30))

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        window = window_size or self.window
        if window > self.window:
            raise ValueError(f"mask window {window} is wider than the cache window {self.window}")
        o = self.offset
        if o + N <= window and not return_array and self._presented(o + N, N) == o + N:
            # Nothing has left the window yet (and nothing is stale): the same
            # masks mlx-lm's caches give.
            return None if N == 1 else "causal"
        return window_visible(mx.arange(o, o + N), self.key_positions(N), window, causal=True)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        if self._high - (self.offset - n) > self.room:
            raise ValueError(
                f"cannot roll a sliding-window cache back {n} rows: it has room for "
                f"{self.max_block + 1} (make the target cache with a larger max_block)"
            )
        self.offset -= n
        return n

    def size(self) -> int:
        return min(self.offset, self.capacity)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def state(self):
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    @property
    def extra_nbytes(self) -> int:
        """Bytes of the rows held beyond the window (the rollback room)."""
        if self.keys is None:
            return 0
        rows = self.keys.shape[2]
        return self.nbytes * max(0, rows - self.window) // rows
