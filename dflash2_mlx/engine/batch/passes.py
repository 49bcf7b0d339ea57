"""The two batched passes of a cycle: one drafter pass over every drafting
sequence's block, one target pass over every running sequence's rows.

Both take per-sequence inputs of different lengths, right-pad them into one
batch, and hand back per-sequence outputs cut to each sequence's own rows;
the caches stay per sequence (layer_view.py, draft_view.py).
"""

from functools import partial
from typing import Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..pair import Pair
from ..kv_buckets import BucketedKVCache
from ..target.caches import WindowKVCache
from .draft_view import BatchDraftContext
from .layer_view import BatchLayerView
from .plain_run import PlainRun, holds

# Target cache kinds a batched pass knows how to view (layer_view.py).
_BATCHABLE = (KVCache, BucketedKVCache, WindowKVCache)


def batch_blocker(pair: Pair) -> Optional[str]:
    """Why this pair's sequences cannot share a target pass, or None."""
    if getattr(pair.target, "collectives", None) is not None:
        return "the target is split over ranks (each rank runs one sequence at a time)"
    for c in pair.target.make_cache():
        if type(c) not in _BATCHABLE:
            kind = "recurrent (Gated DeltaNet)" if hasattr(c, "cache") else type(c).__name__
            return f"its {kind} layers keep a state that one batched pass cannot keep per sequence yet"
    return None


def target_pass(pair: Pair, groups: Sequence[tuple], run: Optional[PlainRun] = None):
    """Run every sequence's rows through the target in one pass. `groups[i]` is
    (tokens [rows, n], layer members): a chain or plain row as [1, n] with the
    sequence's own target caches (its rows are appended to them), or a tree's
    nodes as [N, 1] with its `tree_views` (nothing is written; finish_tree does).
    `run`: the batch decoder's buffers for passes of one plain row each (plain_run.py).
    Returns per group (logits [rows, n, V], features [rows, n, F] or None)."""
    layers = [[members[j] for _, members in groups] for j in range(len(groups[0][1]))]
    offsets = [m.offset for m in layers[0]]  # a tree's views: a vector each
    one_row = (run is not None and len(groups) > 1 and all(t.shape == (1, 1) for t, _ in groups)
               and all(isinstance(o, int) for o in offsets) and holds(offsets))
    if run is not None and not one_row:
        run.clear()  # any other pass ends the run: the caches get their rows back first
    if len(groups) == 1:  # one sequence: its own caches (or tree views) as they are, no padding to mask
        tokens, members = groups[0]
        return [pair.target(tokens, members, pair.layer_ids)]
    width = max(t.shape[1] for t, _ in groups)
    tokens = mx.concatenate([t if t.shape[1] == width else mx.pad(t, [(0, 0), (0, width - t.shape[1])])
                             for t, _ in groups])
    lengths = [t.shape[1] for t, _ in groups]
    if one_row:
        views = run.views(layers, offsets)
    else:
        views = [BatchLayerView(members, lengths) for members in layers]
    logits, features = pair.target(tokens, views, pair.layer_ids)
    out, at = [], 0
    for t, _ in groups:
        rows, n = t.shape
        out.append((logits[at : at + rows, :n], None if features is None else features[at : at + rows, :n]))
        at += rows
    return out


def draft_pass(pair: Pair, anchors: Sequence[int], blocks: Sequence[int], pending: Sequence[Optional[mx.array]],
               caches: Sequence[list]):
    """Draft every sequence's block (`anchors[i]` then `blocks[i] - 1` masks) in one
    drafter pass; `pending[i]`: features [1, p, F] of its committed rows the drafter has
    not seen (they enter `caches[i]` first). Returns per sequence (hidden [b-1, H], logits [b-1, V])."""
    drafter, target = pair.drafter, pair.target
    width, mask = max(blocks), pair.mask_token_id
    ids = mx.array([[a] + [mask] * (width - 1) for a in anchors], dtype=mx.int32)  # padding rows are masks too
    if len(blocks) == 1:  # one sequence: its own draft, as alone
        return [drafter.draft(ids, pending[0], caches[0], target)]
    counts = [0 if p is None else p.shape[1] for p in pending]
    features = None
    if any(counts):
        width, like = max(counts), next(p for p in pending if p is not None)
        features = mx.concatenate([mx.zeros((1, width, like.shape[2]), like.dtype) if p is None else
                                   mx.pad(p, [(0, 0), (0, width - p.shape[1]), (0, 0)]) for p in pending], axis=0)
    layers = [[c[j] for c in caches] for j in range(len(caches[0]))]
    context = partial(BatchDraftContext, pending=counts, blocks=list(blocks))
    hidden = drafter(target.embed(ids), features, layers, context=context)[:, 1:]
    hidden = hidden.astype(target.activation_dtype)
    logits = target.lm_head(hidden)
    return [(hidden[i, : b - 1], logits[i, : b - 1]) for i, b in enumerate(blocks)]

