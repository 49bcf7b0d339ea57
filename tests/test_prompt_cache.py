"""Multi-turn decoding keeps the conversation in the target and drafter caches:
a second turn prefills only its new tokens and equals a fresh run over the
whole history, including when the first answer ended inside a verified block."""

import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.decode.loop import DecodeCache
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.text.generate import stream_generate
from helpers import load_pair_for


def run(target, tokenizer, ids, drafter, cache=None, block_size=None, **kw):
    request = DecodeRequest(block_size=block_size, **kw)
    rs = list(stream_generate(Pair.make(target, drafter), tokenizer, ids, request, prompt_cache=cache))
    return [r.token for r in rs], rs[-1]


@pytest.mark.parametrize("use_drafter", [True, False])
def test_second_turn_equals_fresh_run(use_drafter):
    target, tokenizer, drafter = load_pair_for("qwen3", "dflash2")
    drafter = drafter if use_drafter else None
    cache = DecodeCache(target.make_cache(), drafter.make_cache() if drafter else None)
    turn1 = [5, 9, 13, 2]
    out1, last1 = run(target, tokenizer, turn1, drafter, cache, max_tokens=23, block_size=8)
    assert cache.tokens == turn1 + out1
    assert cache.offset == len(cache.tokens) - 1
    if drafter:
        assert cache.drafter_rows == cache.offset  # read, or waiting unread (DecodeCache.unread)
    # Next turn: the last answer token (not yet run) plus the new user tokens.
    turn2 = [out1[-1], 40, 41, 42]
    out2, last2 = run(target, tokenizer, turn2, drafter, cache, max_tokens=20, block_size=8)
    assert last2.prompt_tokens == len(turn2)  # only the new tokens were prefilled
    fresh, _ = run(target, tokenizer, turn1 + out1 + turn2[1:], drafter, None, max_tokens=20, block_size=8)
    assert out2 == fresh


def test_stop_inside_a_block_rewinds_the_cache():
    target, tokenizer, drafter = load_pair_for("qwen3", "dflash2")
    cache = DecodeCache(target.make_cache(), drafter.make_cache())
    ids = [5, 9, 13, 2]
    full, _ = run(target, tokenizer, ids, drafter, None, max_tokens=30)
    stop_text = tokenizer.decode(full[5:7])
    out, last = run(target, tokenizer, ids, drafter, cache, max_tokens=30, stop=[stop_text])
    assert last.finish_reason == "stop" and len(out) < 30
    assert cache.tokens == ids + out
    assert cache.offset == cache.drafter_rows == len(cache.tokens) - 1
