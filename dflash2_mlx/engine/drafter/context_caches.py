"""Context caches of the drafter's layers that keep only some rows.

A sliding layer keeps its trained window (`ContextWindowCache`); under
`--draft-window N` a full-attention layer keeps the first rows and the latest
N (`SinkWindowCache`). Both keep `room` extra rows so a caller can rewind, and
both stay bounded however long the context grows.
"""

from typing import Optional

import mlx.core as mx

from ...errors import DFlashError

# Rows a `--draft-window` always keeps from the start of the context. The first
# positions soak up attention whatever they hold (the "attention sink" of
# StreamingLLM, Xiao et al. 2023, where 4 rows sufficed); dropping them shifts
# every softmax, so a window without them drafts worse than its size suggests.
SINK_ROWS = 4



class ContextWindowCache:
    """Context cache of a sliding drafter layer: only the last `size` rows
    (window − 1) are attended, so memory stays bounded; `room` is the rows it
    can roll back (as `WindowKVCache.room`): that many extra rows are kept so
    a multi-turn caller can rewind up to one block exactly. Rows carry RoPE at
    their absolute positions, so `offset` counts every row ever added, and
    attention over context rows does not depend on their order."""

    def __init__(self, size: int, room: int = 16):
        self.size, self.room = size, room
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self.offset += keys.shape[2]
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        keep = self.size + self.room
        self.keys, self.values = keys[:, :, -keep:], values[:, :, -keep:]
        return self.keys_and_values()

    def keys_and_values(self):
        return self.keys[:, :, -self.size :], self.values[:, :, -self.size :]

    @property
    def state(self):
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        stored = 0 if self.keys is None else self.keys.shape[2]
        if stored - n < min(self.size, self.offset - n):
            raise ValueError(f"cannot rewind {n} rows: only {self.room} rows beyond the window are kept")
        self.offset -= n
        if n:
            self.keys, self.values = self.keys[:, :, : stored - n], self.values[:, :, : stored - n]
        return n


class SinkWindowCache:
    """Context cache of a full-attention drafter layer under `--draft-window`:
    the first `sink` rows and the latest `size` rows are attended (all rows
    while there are no more than that), so memory stays bounded by
    sink + size + room rows. `room` extra recent rows are kept so a caller can
    rewind by up to that many rows (as `ContextWindowCache`). Rows carry RoPE at
    their absolute positions and the block attends to context rows without a
    mask, so only which rows are kept differs from a full `KVCache`."""

    def __init__(self, size: int, sink: int = SINK_ROWS, room: int = 16):
        self.size, self.sink, self.room = size, sink, room
        self.sink_keys = self.sink_values = self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        held = 0 if self.sink_keys is None else self.sink_keys.shape[2]
        take = min(self.sink - held, keys.shape[2])
        if take > 0:  # the first rows ever added fill the sink
            head_k, head_v = keys[:, :, :take], values[:, :, :take]
            if self.sink_keys is not None:
                head_k = mx.concatenate([self.sink_keys, head_k], axis=2)
                head_v = mx.concatenate([self.sink_values, head_v], axis=2)
            self.sink_keys, self.sink_values = head_k, head_v
            keys, values = keys[:, :, take:], values[:, :, take:]
        self.offset += take + keys.shape[2]
        if keys.shape[2]:
            if self.keys is not None:
                keys = mx.concatenate([self.keys, keys], axis=2)
                values = mx.concatenate([self.values, values], axis=2)
            keep = self.size + self.room
            self.keys, self.values = keys[:, :, -keep:], values[:, :, -keep:]
        return self.keys_and_values()

    def keys_and_values(self):
        if self.keys is None or self.keys.shape[2] == 0:
            return self.sink_keys, self.sink_values
        k, v = self.keys[:, :, -self.size :], self.values[:, :, -self.size :]
        return mx.concatenate([self.sink_keys, k], axis=2), mx.concatenate([self.sink_values, v], axis=2)

    @property
    def state(self):
        return tuple(a for a in (self.sink_keys, self.sink_values, self.keys, self.values) if a is not None)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        end = self.offset - n
        recent = 0 if self.keys is None else self.keys.shape[2]
        if end <= self.sink:  # back inside the sink: every row left is a sink row
            if recent < self.offset - self.sink:
                raise ValueError(f"cannot rewind {n} rows: only {self.room} rows beyond the window are kept")
            self.keys = self.values = None
            if self.sink_keys is not None:
                self.sink_keys, self.sink_values = self.sink_keys[:, :, :end], self.sink_values[:, :, :end]
        else:
            if recent - n < min(self.size, end - self.sink):
                raise ValueError(f"cannot rewind {n} rows: only {self.room} rows beyond the window are kept")
            if n:
                self.keys, self.values = self.keys[:, :, : recent - n], self.values[:, :, : recent - n]
        self.offset = end
        return n


def check_draft_window(rows: Optional[int]) -> None:
    """Refuse a drafter window that keeps no recent rows (None: the checkpoint's own)."""
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise DFlashError(f"draft window {rows!r}: keep at least 1 recent context row (e.g. 256 or 1024), "
                          "or leave it unset for the drafter's own attention")
