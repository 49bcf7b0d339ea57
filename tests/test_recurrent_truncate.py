"""An answer that ends inside a verified block on a recurrent (qwen3_5, Gated
DeltaNet) target rewinds the caches exactly, so the next turn prefills only
its new tokens: no re-prefill of the conversation.

The expectation is the target's own greedy output (autoregressive, fresh
caches); the scripted drafter proposes it, so every block is accepted whole and
the stop lands inside one.
"""

import pytest

from dflash2_mlx.engine.decode.loop import DecodeCache
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.text.generate import stream_generate
from helpers import ScriptedDrafter, ar_tokens, decode_steps, load_pair_for

PROMPT = [17, 42, 99, 7, 250, 3, 61, 8]
B = 8


@pytest.fixture(scope="module")
def qwen3_5():
    target, tokenizer, drafter = load_pair_for("qwen3_5", "dflash2")
    reference = ar_tokens(target, PROMPT, 40)
    accept_all = ScriptedDrafter(drafter, reference, len(PROMPT), lambda c: B, target.vocab_size)
    return target, tokenizer, drafter, accept_all, reference


def test_truncate_inside_the_last_block_replays_instead_of_going_stale(qwen3_5):
    target, _, drafter, scripted, reference = qwen3_5
    cache = DecodeCache(target.make_cache(), scripted.make_cache())
    steps = decode_steps(PROMPT, Pair.make(target, scripted), DecodeRequest(max_tokens=40, block_size=B),
                         prompt_cache=cache)
    first, block = next(steps), next(steps)
    steps.close()
    assert first.tokens == (reference[0],) and len(block.tokens) == B  # the premise: a whole block
    cut = len(PROMPT) + 1 + 3  # the answer ends on the block's third token
    cache.truncate(cut)
    assert not cache.stale
    assert cache.tokens == PROMPT + reference[:4]
    assert cache.offset == cache.drafter_rows == cut - 1
    # The next turn continues from the cache exactly as a fresh run over everything.
    turn2 = [40, 41, 42]
    fresh = ar_tokens(target, PROMPT + reference[:4] + turn2, 12)
    more = decode_steps([reference[3]] + turn2, Pair.make(target, drafter), DecodeRequest(max_tokens=12, block_size=B),
                        prompt_cache=cache)
    assert [t for s in more for t in s.tokens] == fresh


def test_cut_before_the_last_block_still_marks_the_cache_stale(qwen3_5):
    # Only the last verified block is kept: a cut further back cannot be replayed.
    target, _, _, scripted, reference = qwen3_5
    cache = DecodeCache(target.make_cache(), scripted.make_cache())
    steps = decode_steps(PROMPT, Pair.make(target, scripted), DecodeRequest(max_tokens=40, block_size=B),
                         prompt_cache=cache)
    next(steps), next(steps), next(steps)
    steps.close()
    cache.truncate(len(PROMPT) + 3)  # inside the first block, not the second
    assert cache.stale


def test_stop_string_inside_a_block_then_next_turn_prefills_only_new_tokens(qwen3_5):
    target, tokenizer, drafter, scripted, reference = qwen3_5
    cache = DecodeCache(target.make_cache(), scripted.make_cache())
    stop = tokenizer.decode(reference[4:6])
    request = DecodeRequest(max_tokens=40, block_size=B, stop=[stop])
    out = [r.token for r in stream_generate(Pair.make(target, scripted), tokenizer, PROMPT, request, prompt_cache=cache)]
    assert out == reference[: len(out)] and 1 < len(out) < 1 + B  # stopped inside the first verified block
    assert not cache.stale and cache.offset == cache.drafter_rows == len(cache.tokens) - 1
    turn2 = [out[-1], 40, 41, 42]
    request = DecodeRequest(max_tokens=12, block_size=B)
    rs = list(stream_generate(Pair.make(target, drafter), tokenizer, turn2, request, prompt_cache=cache))
    assert rs[-1].prompt_tokens == len(turn2)  # only the new tokens were prefilled
    assert [r.token for r in rs] == ar_tokens(target, PROMPT + out + turn2[1:], 12)
