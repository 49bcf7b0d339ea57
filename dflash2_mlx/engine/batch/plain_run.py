"""A run of one-row batched passes: each layer's batch in one buffer, as mlx-lm's `BatchKVCache`.

Any other batched pass gathers every sequence's keys into one batch per layer
(layer_view.py): a copy of the whole context each pass, which made a plain pass
of 8 sequences cost a quarter more than mlx-lm's `BatchKVCache`. When every
sequence adds one row (plain decoding, ahead.py) the layer's rows live in one
[B, H, capacity, D] buffer instead, sequence i's rows in slot i from column 0:
a pass writes each sequence's row at its offset (one scatter) and attends over
the buffer up to the longest sequence (on CUDA to the bucket's end, `columns`),
each slot's own columns unmasked. The pass's offset vector and mask are built
once and shared by its layers.

Nothing is held twice: each sequence's own cache holds its slot as its buffer
(`keys = buffer[i : i + 1]`, a view, no copy), so whatever reads a sequence's
cache between passes (a trim, tree views, the memory it counts) reads its own
rows. The next one-row pass of the same sequences writes into the buffer again
while every cache still holds the slot it was given at the offset it left
(else that layer is gathered afresh). When the run ends (any other pass, or a
sequence leaves) every cache gets its slot back as a buffer of its own
(`clear`), so no cache, one kept in a prompt cache included, holds the whole
batch's buffer alive.
"""

from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ...device import backend_name
from ..kv_buckets import STEP, BucketedKVCache, bucket
from .layer_view import BatchLayerView, stack_right_padded

# Caches that hold their rows in the first `offset` columns of `keys` / `values`
# (a sliding ring does not: it is gathered every pass, layer_view.py).
SLOT_CACHES = (KVCache, BucketedKVCache)
WHOLE_BUCKETS = backend_name() == "cuda"


def holds(offsets: list[int]) -> bool:
    """Whether a run may hold members at these offsets: each has rows (a buffer to gather),
    and its slots, each as wide as the longest, hold at most twice the rows their own
    buffers would (a long sequence beside short ones is gathered each pass instead of
    padding every slot to it)."""
    return min(offsets) > 0 and len(offsets) * bucket(max(offsets) + 1) <= 2 * sum(bucket(o + 1) for o in offsets)


class PlainRun:
    """Per layer index: the `_Batch` of the run's latest pass (see module doc)."""

    def __init__(self):
        self.layers: dict[int, "_Batch"] = {}

    def views(self, layers: list, offsets: list[int]) -> list:
        """The layer views of a pass of one row per member (`layers[j]`: layer j's caches,
        `offsets`: the members' rows before it, the same in every layer)."""
        if any(j >= len(layers) or not _same(b.members, layers[j]) for j, b in self.layers.items()):
            self.clear()  # someone joined or left: every slot back before the new batch
        offset = mx.array(offsets)  # one vector for every layer: a sequence's layers hold the same rows
        return [RunLayerView(self, j, ms, offsets, offset) if all(type(m) in SLOT_CACHES for m in ms)
                else BatchLayerView(ms, [1] * len(ms)) for j, ms in enumerate(layers)]

    def clear(self) -> None:
        """End the run: each cache still holding its slot gets a copy of it as its own buffer."""
        copies = []
        for b in self.layers.values():
            for m, k, v in zip(b.members, b.keys, b.values):
                if m.keys is k and m.values is v:
                    m.keys, m.values = mx.array(k), mx.array(v)
                    copies += [m.keys, m.values]
        self.layers = {}
        # Evaluated now, so a copy (of a cache that leaves, say) never holds the batch's buffer.
        mx.async_eval(copies)

    def write(self, layer: int, members: list, offsets: list[int], at: mx.array, keys: mx.array,
              values: mx.array) -> tuple[mx.array, mx.array]:
        """Write row i of `keys` / `values` at column `offsets[i]` of slot i of layer `layer`'s
        buffer; each member's cache gets its slot; returns the buffer up to the longest row."""
        kept = self.layers.pop(layer, None)
        if kept is not None and kept.continues(members, offsets):
            K, V = kept.buffer
        else:
            K, V = _gather(members, offsets, "keys"), _gather(members, offsets, "values")
        # The old slots and batch go before the pass runs, so the scatter writes the buffer in place.
        kept = None
        if max(offsets) + 1 > K.shape[2]:
            K, V = _grow(K), _grow(V)
        K = mx.put_along_axis(K, mx.broadcast_to(at, keys.shape), keys, axis=2)
        V = mx.put_along_axis(V, mx.broadcast_to(at, values.shape), values, axis=2)
        batch = _Batch(tuple(members), (K, V), tuple(o + 1 for o in offsets))
        for i, m in enumerate(members):
            m.keys, m.values, m.offset = batch.keys[i], batch.values[i], offsets[i] + 1
        self.layers[layer] = batch
        width = columns(offsets)
        return K[..., :width, :], V[..., :width, :]


class _Batch:
    """One layer's buffer, its members and the slots and offsets they were given."""

    def __init__(self, members: tuple, buffer: tuple, offsets: tuple):
        self.members, self.buffer, self.offsets = members, buffer, offsets
        K, V = buffer
        self.keys = [K[i : i + 1] for i in range(len(members))]
        self.values = [V[i : i + 1] for i in range(len(members))]

    def continues(self, members: list, offsets: list[int]) -> bool:
        """Whether the same caches still hold their slots where this pass left them."""
        return (_same(members, self.members) and tuple(offsets) == self.offsets
                and all(m.keys is k and m.values is v for m, k, v in zip(members, self.keys, self.values)))


class RunLayerView(BatchLayerView):
    """A `BatchLayerView` of one row per member whose batch is the run's buffer."""

    def __init__(self, run: PlainRun, layer: int, members: list, offsets: list[int], offset: mx.array):
        super().__init__(members, [1] * len(members))
        self.run, self.layer, self.offsets, self._offset = run, layer, offsets, offset
        self._written = False

    @property
    def offset(self) -> mx.array:
        """The members' rows, as each cache counts them (one more once this layer wrote)."""
        return self._offset + 1 if self._written else self._offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self._written = True
        return self.run.write(self.layer, self.members, self.offsets, self._offset.reshape(-1, 1, 1, 1),
                              keys, values)

    def make_mask(self, N: int, return_array: bool = False, window_size: Optional[int] = None) -> mx.array:
        """Row i sees its slot's columns up to its new row (within `window_size`), as its own cache's mask."""
        q = self._offset[:, None]
        k = mx.arange(columns(self.offsets))[None]
        mask = k <= q
        if window_size is not None:
            mask = mask & (k > q - window_size)
        return mask[:, None, None, :]


def columns(offsets: list[int]) -> int:
    """Key columns a run's pass attends over: up to the longest row, or on CUDA to the end of
    its bucket (the buffer's end): there a masked attention goes to cuDNN, whose plans are
    cached per key length (kv_buckets.py), so the length changes once per bucket."""
    width = max(offsets) + 1
    return bucket(width) if WHOLE_BUCKETS else width


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _gather(members: list, offsets: list[int], name: str) -> mx.array:
    """The members' `name` buffers as slots of one [B, H, capacity, D] buffer (whole buckets)."""
    capacity = bucket(max(offsets) + 1)
    return stack_right_padded([getattr(m, name)[..., :capacity, :] for m in members], capacity)


def _grow(buffer: mx.array) -> mx.array:
    B, H, _, D = buffer.shape
    return mx.concatenate([buffer, mx.zeros((B, H, STEP, D), buffer.dtype)], axis=2)
