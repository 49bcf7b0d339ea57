"""What one block keeps of each cache layer, and how layers are rebuilt from blocks.

A plain attention layer (mlx-lm's `KVCache`, in the target and in the
drafter's context) is cut into blocks: a block keeps that block's key and
value rows, and a prefix is the rows of its blocks concatenated. Every other
layer cannot be cut that way: recurrent state (`RecurrentCache`) is one
state after all the rows, and window caches (`WindowKVCache`,
`ContextWindowCache`, `SinkWindowCache`) keep only a bounded tail. For them a
block keeps a snapshot of the whole layer at the block's end boundary (its
state arrays and counters), which a prefix ending there restores as is. Those
snapshots are bounded by the state or window size, not by the context.

A block is kept as two entries: its rows (`ROWS`: the row layers' part, the
others marked `ELSEWHERE`) and, only every few blocks, its snapshot
(`SNAPSHOT`: the snapshot layers' part, the row layers `ELSEWHERE`); a prefix
can end only at a block whose snapshot is kept (`merge` joins the two).
"""

from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ...engine.kv_buckets import BucketedKVCache

ROWS, SNAPSHOT, ELSEWHERE = "rows", "snapshot", "elsewhere"


class NotStorable(Exception):
    """A layer holds something a block cannot keep (the entry is not stored)."""


def layers_of(cache) -> list:
    """The target's layers, then the drafter's."""
    return list(cache.target) + list(cache.drafter or [])


def cuts_into_rows(layer) -> bool:
    """Whether a block of this layer is its own rows (else a snapshot)."""
    return type(layer) in (KVCache, BucketedKVCache)


def _kind(layer) -> str:
    """The layer kind a stored part names: rows are rows, whatever bucketing the
    cache's buffer has (so blocks written before it existed still restore)."""
    return "KVCache" if cuts_into_rows(layer) else type(layer).__name__


def has_snapshots(cache) -> bool:
    """Whether some layer keeps snapshots (a prefix then ends only where one is kept)."""
    return not all(map(cuts_into_rows, layers_of(cache)))


def capture(cache, start: int, end: int, entry: str = ROWS) -> list[dict]:
    """Each layer's part of the block of rows [start, end) for one entry
    (`ROWS` or `SNAPSHOT`; the other kind of layer is `ELSEWHERE`); the
    caches hold `end` rows (snapshot layers are read at that boundary)."""
    return [_capture(c, start, end) if (entry == ROWS) == cuts_into_rows(c)
            else {"kind": ELSEWHERE, "class": _kind(c)} for c in layers_of(cache)]


def merge(rows: list[dict], snapshot: list[dict]) -> list[dict]:
    """A block's two entries as one whole block (every layer's own part)."""
    return [s if r["kind"] == ELSEWHERE else r for r, s in zip(rows, snapshot)]


def _capture(c, start: int, end: int) -> dict:
    if cuts_into_rows(c):
        # New array objects: the cache writes into its own buffers in place later.
        return {"kind": ROWS, "class": "KVCache", "keys": mx.array(c.keys[..., start:end, :]),
                "values": mx.array(c.values[..., start:end, :])}
    out = {"kind": SNAPSHOT, "class": type(c).__name__}
    for name, value in vars(c).items():
        if isinstance(value, mx.array):
            out[name] = mx.array(value)
        elif isinstance(value, (list, tuple)) and all(v is None or isinstance(v, mx.array) for v in value):
            out[name] = [None if v is None else mx.array(v) for v in value]
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            raise NotStorable(f"{type(c).__name__}.{name} is a {type(value).__name__}")
    return out


def can_restore(cache, blocks: list[list[dict]]) -> bool:
    """Whether `blocks` (each a list of layer parts) fit the layers of `cache`."""
    layers = layers_of(cache)
    fits = all(len(b) == len(layers) and all(p["class"] == _kind(c) for p, c in zip(b, layers))
               for b in blocks)
    return fits and all(p["kind"] != ELSEWHERE for p in blocks[-1])  # the last one is whole


def restore(cache, blocks: list[list[dict]]) -> None:
    """Rebuild the fresh layers of `cache` to hold the prefix of `blocks`."""
    for i, c in enumerate(layers_of(cache)):
        parts = [b[i] for b in blocks]
        last = parts[-1]
        if last["kind"] == ROWS:
            keys = mx.concatenate([p["keys"] for p in parts], axis=2)
            values = mx.concatenate([p["values"] for p in parts], axis=2)
            c.keys, c.values, c.offset = keys, values, keys.shape[2]
            continue
        for name, value in last.items():
            if name in ("kind", "class"):
                continue
            if isinstance(value, mx.array):
                value = mx.array(value)  # the stored block must not see the cache's in-place writes
            elif isinstance(value, list):
                value = [None if v is None else mx.array(v) for v in value]
            setattr(c, name, value)
    mx.eval([a for c in layers_of(cache) for a in _arrays(vars(c))])


def _arrays(d: dict) -> list:
    out = []
    for v in d.values():
        if isinstance(v, mx.array):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, mx.array))
    return out


def parts_nbytes(parts: list[dict]) -> int:
    return sum(a.nbytes for p in parts for a in _arrays(p))


def flatten(parts: list[dict]) -> tuple[dict, list]:
    """(arrays by name, the JSON-able layout the rest of each part needs), the
    split mlx-lm's `save_prompt_cache` makes between tensors and metadata."""
    arrays, layout = {}, []
    for i, part in enumerate(parts):
        entry = {}
        for name, value in part.items():
            if isinstance(value, mx.array):
                arrays[f"{i}.{name}"] = value
                entry[name] = "array"
            elif isinstance(value, list):
                entry[name] = ["none" if v is None else "array" for v in value]
                arrays.update({f"{i}.{name}.{j}": v for j, v in enumerate(value) if v is not None})
            else:
                entry[name] = {"value": value}
        layout.append(entry)
    return arrays, layout


def unflatten(arrays: dict, layout: list) -> Optional[list[dict]]:
    """The parts `flatten` split (None when an array is missing)."""
    parts = []
    try:
        for i, entry in enumerate(layout):
            part = {}
            for name, how in entry.items():
                if how == "array":
                    part[name] = arrays[f"{i}.{name}"]
                elif isinstance(how, list):
                    part[name] = [None if h == "none" else arrays[f"{i}.{name}.{j}"] for j, h in enumerate(how)]
                else:
                    part[name] = how["value"]
            parts.append(part)
    except (KeyError, TypeError):
        return None
    return parts
