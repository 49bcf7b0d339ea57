"""Verify passes whose shapes repeat (engine/kv_buckets.py).

MLX's CUDA backend builds a cuDNN plan for every new shape of a masked
multi-row attention; a verify pass whose key length grows by the accepted
tokens every cycle built plans every cycle (an H200: a 16-row verify cost 8x a
one-row step). The guard: decode 300 tokens with blocks 4 and 16, a tree and a
batch of 4, record the shape of every attention call (a thin shim around
`mx.fast.scaled_dot_product_attention`, the real kernel still runs) and
count the distinct key lengths each query shape meets. They must be bounded
by the context buckets the run crosses, not by its tokens or cycles. The
tiny pair's random drafter is rejected almost every cycle, so without
buckets every cycle presents a new key length.

What is recorded is what MLX's CUDA backend keys a cuDNN plan on (its
scaled_dot_product_attention.cpp): the q, k and v shapes, the mask's shape (or
the causal flag) and the dtype. It also keys on the strides, that is on the
length of the buffer a key slice is cut from: every padded pass presents its
cache's buffer up to a bucket's end or the ring's end, whose length is the key
length the guard counts. Window caches (a sliding target layer's ring, a
sliding drafter layer, `--draft-window`) present whole buckets too until they
are full, then their full length: those lengths are allowed beside the buckets.
"""

from collections import defaultdict

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.batch.decoder import BatchDecoder
from dflash2_mlx.engine.kv_buckets import STEP, BucketedKVCache, bucket
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.plan import plan
from dflash2_mlx.engine.request import DecodeRequest
from helpers import decode_steps, load_pair_for

TOKENS = 300
PROMPT = 12
OWN_ROWS = 16  # the largest block (or tree path) a pass adds to the context's buckets


@pytest.fixture(scope="module")
def pair():
    target, _, drafter = load_pair_for("qwen3")
    return Pair.make(target, drafter)


@pytest.fixture
def shapes(monkeypatch):
    """Every multi-row attention call's (query shape, key length)."""
    seen = []
    real = mx.fast.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        if q.shape[0] * q.shape[2] > 1:  # one-row steps keep mlx-lm's exact path on purpose
            mask = kwargs.get("mask")
            plan = (tuple(q.shape), tuple(k.shape), tuple(v.shape), mask if isinstance(mask, str) or mask is None
                    else tuple(mask.shape), str(q.dtype))
            seen.append(((q.shape[0], q.shape[2]), k.shape[2], plan))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", recording)
    return seen


def key_lengths_by_query(seen) -> dict:
    out = defaultdict(set)
    for query, keys, *_ in seen:
        out[query].add(keys)
    return out


def assert_bounded(seen, contexts: int, full=()) -> None:
    """Every key length is whole buckets of context (or a full window cache's length,
    `full`) plus at most a block's (or a tree path's) own rows, so each query shape meets
    a set bounded by block sizes x buckets; and so does every plan key (shapes, mask, dtype)."""
    buckets = bucket(contexts) // STEP + 1
    by_query = key_lengths_by_query(seen)
    assert by_query, "no multi-row attention was recorded"

    def allowed(k):
        return k % STEP <= OWN_ROWS or any(0 <= k - c <= OWN_ROWS for c in full)

    off = {q: sorted(k for k in ks if not allowed(k)) for q, ks in by_query.items()}
    grown = {q: ks for q, ks in off.items() if ks}
    grown.update({q: sorted(ks) for q, ks in by_query.items() if len(ks) > (buckets + len(full)) * (OWN_ROWS + 1)})
    assert grown == {}, "key lengths grow with the tokens (not whole buckets plus a block)"
    plans = {entry[2] for entry in seen if len(entry) == 3}
    assert len(plans) <= len(by_query) * (buckets + len(full)) * (OWN_ROWS + 1) * 4, "plan keys grow with the tokens"


def prompt(pair, seed=0):
    return np.random.default_rng(seed).integers(0, pair.target.vocab_size - 1, PROMPT).tolist()


@pytest.mark.parametrize("block, tree", [(4, 0), (16, 0), (None, 8)], ids=["block4", "block16", "tree8"])
def test_a_long_decode_presents_a_bounded_set_of_attention_shapes(pair, shapes, block, tree):
    steps = list(decode_steps(prompt(pair), pair, DecodeRequest(max_tokens=TOKENS, block_size=block, tree_rows=tree)))
    assert sum(len(s.tokens) for s in steps) == TOKENS
    assert len(steps) > TOKENS // 3  # mostly rejected: hundreds of cycles, each a new context length
    assert_bounded(shapes, PROMPT + TOKENS + 16)


def test_a_batch_of_four_presents_a_bounded_set_of_attention_shapes(pair, shapes):
    decoder = BatchDecoder(pair, max_batch=4)
    for i, (block, tree) in enumerate([(4, 0), (16, 0), (8, 0), (None, 6)]):
        ids = prompt(pair, seed=i)
        request = DecodeRequest(max_tokens=TOKENS, block_size=block, tree_rows=tree)
        decoder.add(ids, plan(pair, request, prompt_ids=ids, batched=True))
    made = 0
    while decoder.sequences:
        for seq, step in decoder.step():
            made += len(step.tokens)
        for seq in [s for s in decoder.sequences if s.finished]:
            decoder.remove(seq)
    assert made == 4 * TOKENS
    assert_bounded(shapes, PROMPT + TOKENS + 16)


WINDOW = 96  # a sliding target layer's window and a sliding drafter's: both fill within the decode
DRAFT_WINDOW = 64  # --draft-window: the sink rows and the latest 64


@pytest.fixture(scope="module")
def window_pairs(tmp_path_factory):
    """A target with sliding layers (its ring: WINDOW + max block rows), with a sliding
    drafter, and with a full-attention drafter under --draft-window."""
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target
    from dflash2_mlx.tools.synthetic import drafter_config_dict, target_config, write_drafter, write_target

    root = tmp_path_factory.mktemp("windows")
    dims = dict(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=WINDOW)
    target, _ = load_target(str(write_target(root / "target", "llama", **dims)))
    config = target_config("llama", **dims)
    sliding = drafter_config_dict(config, "dflash2", sliding=True)
    sliding.update(sliding_window=WINDOW)
    full = load_drafter(str(write_drafter(root / "full", drafter_config_dict(config, "dflash2"))))
    full.set_context_window(DRAFT_WINDOW)
    return {"sliding": Pair.make(target, load_drafter(str(write_drafter(root / "sliding", sliding)))),
            "draft-window": Pair.make(target, full)}


@pytest.mark.parametrize("drafter", ["sliding", "draft-window"])
def test_window_caches_present_bucketed_key_lengths_too(window_pairs, shapes, drafter):
    """Until a window cache is full, a multi-row pass sees its rows in whole buckets
    (the rest masked off); once full, its full length: a few lengths, not one per cycle."""
    pair = window_pairs[drafter]
    target = pair.target
    ring = WINDOW + target.max_block  # WindowKVCache's capacity
    drafted = (WINDOW - 1) if drafter == "sliding" else 4 + DRAFT_WINDOW  # the drafter's full context
    steps = list(decode_steps(prompt(pair), pair, DecodeRequest(max_tokens=TOKENS, block_size=8)))
    assert sum(len(s.tokens) for s in steps) == TOKENS and len(steps) > TOKENS // 4
    assert_bounded(shapes, PROMPT + TOKENS + 16, full=(ring, drafted))


def test_the_bound_catches_a_key_length_per_cycle():
    """The assertion itself: one new key length per cycle fails it, and so do too many
    lengths inside the buckets."""
    with pytest.raises(AssertionError, match="grow with the tokens"):
        assert_bounded([((1, 4), PROMPT + n) for n in range(40)], PROMPT + 40)
    with pytest.raises(AssertionError, match="grow with the tokens"):
        assert_bounded([((1, 4), STEP * b + n) for b in range(1, 4) for n in range(OWN_ROWS)], STEP)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_bucketed_attention_is_bitwise_the_exact_one_on_this_backend(dtype):
    """What the buckets rest on: a masked key adds an exact zero, so a pass over the
    padded buffer returns the rows a pass over the exact cache returns, and the same
    rows one by one (the CPU backend; accelerators: docs/kernels.md)."""
    mx.random.seed(3)
    H, D, rows = 4, 32, 5
    for context in (1, 37, STEP - rows, STEP + 9):
        exact, padded = [], BucketedKVCache()
        k = mx.random.normal((1, H, context + rows, D)).astype(dtype)
        v = mx.random.normal((1, H, context + rows, D)).astype(dtype)
        q = mx.random.normal((1, H, rows, D)).astype(dtype)
        padded.update_and_fetch(k[:, :, :context], v[:, :, :context])
        mask = padded.make_mask(rows)
        kp, vp = padded.update_and_fetch(k[:, :, context:], v[:, :, context:])
        assert kp.shape[2] == bucket(context + rows) and mask.shape == (rows, kp.shape[2])
        block = mx.fast.scaled_dot_product_attention(q, kp, vp, scale=D**-0.5, mask=mask)
        for i in range(rows):  # row i alone over the exact keys it sees, as a one-row step
            n = context + i + 1
            exact.append(mx.fast.scaled_dot_product_attention(q[:, :, i : i + 1], k[:, :, :n], v[:, :, :n],
                                                              scale=D**-0.5))
        assert mx.array_equal(block, mx.concatenate(exact, axis=2)).item(), f"context {context}"
