"""The batch's keys and values kept from one look-ahead pass to the next.

A batched pass gathers every sequence's keys into one [B, H, width, D] batch
per layer (layer_view.py): a copy of the whole context per pass, which made a
plain pass of 8 sequences cost a quarter more than mlx-lm's `BatchKVCache`
(docs/batching.md). In a run of look-ahead passes (ahead.py: the same
sequences, one plain row each, nothing rolled back) the batch a layer gathered
last pass is still right but for the row each sequence adds: so the pass
writes that row into it too (one scatter) instead of gathering it again.

Each sequence's own caches are written as before, so they stay exact and the
kept batch is only ever a second copy: any pass that is not the next of the
run, a sequence leaving, or a new bucket width gathers afresh.
"""

from typing import Optional

import mlx.core as mx

from .layer_view import PREFIX_CACHES, BatchLayerView, padded_width


class PlainRun:
    """Per layer: (member caches, their offsets, width, keys, values) of the last look-ahead pass."""

    def __init__(self):
        self.layers: dict[int, tuple] = {}

    def clear(self) -> None:
        self.layers = {}

    def views(self, layers: list, offset: mx.array) -> list:
        """The layer views of a pass of one plain row per member: a `RunLayerView` where
        the layer's caches hand back their buffer's first rows (not a sliding ring's)."""
        return [RunLayerView(self, j, members, offset) if all(type(m) in PREFIX_CACHES for m in members)
                else BatchLayerView(members, [1] * len(members), offset) for j, members in enumerate(layers)]


class RunLayerView(BatchLayerView):
    """A `BatchLayerView` of plain rows whose batch is kept in `run` (see module doc)."""

    def __init__(self, run: PlainRun, layer: int, members: list, offset: mx.array):
        super().__init__(members, [1] * len(members), offset)
        self.run, self.layer = run, layer

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        before = tuple(m.offset for m in self.members)
        kept = self._kept(before)
        if kept is None:
            K, V = super().update_and_fetch(keys, values)
        else:
            for i, m in enumerate(self.members):  # each sequence's own caches, as alone
                m.update_and_fetch(keys[i : i + 1], values[i : i + 1])
            at = mx.broadcast_to(self.offset_before(before), keys.shape)
            K = mx.put_along_axis(kept[3], at, keys, axis=2)
            V = mx.put_along_axis(kept[4], at, values, axis=2)
        self._offset = None
        after = tuple(m.offset for m in self.members)
        self.run.layers[self.layer] = (tuple(self.members), after, K.shape[2], K, V)
        return K, V

    def offset_before(self, before: tuple) -> mx.array:
        return (self._offset if self._offset is not None else mx.array(before)).reshape(-1, 1, 1, 1)

    def _kept(self, before: tuple) -> Optional[tuple]:
        """The layer's kept batch when it continues this pass exactly, else None."""
        kept = self.run.layers.get(self.layer)
        if kept is None or len(kept[0]) != len(self.members) or kept[1] != before:
            return None
        if any(a is not b for a, b in zip(kept[0], self.members)):
            return None
        return kept if kept[2] == padded_width(max(before) + 1) else None
