"""`--draft-window N`: the drafter's full-attention layers keep the first
`SINK_ROWS` context rows and the latest N (docs/algorithm.md, "Drafter window").

The window only changes what the drafter attends to, so: greedy output is the
target's own (checked against --ar on the trained built-in pair over a context
the window cuts), the drafter attends to exactly the sink and the latest N rows
(checked against the same layers over an explicitly cut context), its memory
stops growing, and rewinds within its room leave decoding lossless.
"""

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.decode.state import DecodeCache
from dflash2_mlx.engine.drafter.model import CachedContext
from dflash2_mlx.engine.drafter.context_caches import SINK_ROWS, SinkWindowCache
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams
from dflash2_mlx.errors import DFlashError
from dflash2_mlx.loading.load_pair import load_pair
from dflash2_mlx.serve.cache_pool import cache_nbytes
from dflash2_mlx.text.generate import stream_generate
from dflash2_mlx.tools.suites import SUITES
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter
from helpers import target_config
from test_cli import assert_one_line_error, parse_one_json

N = 8  # the window under test: far shorter than the contexts below


def _prompt(tokenizer, tokens: int) -> list[int]:
    text = " ".join(SUITES["code"] * 20)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= tokens
    return ids[:tokens]


@pytest.fixture(scope="module")
def builtin():
    return load_pair("builtin", "builtin")


@pytest.fixture(scope="module")
def windowed():
    return load_pair("builtin", "builtin", draft_window=N)


def _tokens(pair, tokenizer, ids, block_size=8, max_tokens=48, prompt_cache=None):
    request = DecodeRequest(max_tokens=max_tokens, sampling=SamplingParams(), block_size=block_size)
    responses = list(stream_generate(pair, tokenizer, ids, request, prompt_cache=prompt_cache))
    return [r.token for r in responses], responses[-1].stats


# -- (1) lossless through the real generate path -----------------------------------------


def test_greedy_output_with_a_small_window_equals_ar(builtin, windowed):
    pair, tokenizer = builtin
    ids = _prompt(tokenizer, 300)  # 300 context rows against a window of 4 + 8
    ar, _ = _tokens(pair.without_drafter(), tokenizer, ids)
    full, full_stats = _tokens(pair, tokenizer, ids)
    small, small_stats = _tokens(windowed[0], tokenizer, ids)
    assert small == ar and full == ar
    assert small_stats.accepted > 0  # the windowed drafter did draft tokens that were kept
    # The window did change what the drafter saw (same tokens, other proposals).
    assert (small_stats.accepted, small_stats.drafted) != (full_stats.accepted, full_stats.drafted)


def test_the_default_is_the_checkpoints_attention(builtin, windowed):
    assert builtin[0].drafter.context_window is None
    assert all(type(c).__name__ == "BucketedKVCache" for c in builtin[0].drafter.make_cache())
    assert all(isinstance(c, SinkWindowCache) and c.size == N for c in windowed[0].drafter.make_cache())


# -- (2) bounded memory ------------------------------------------------------------------


def _full_drafter(layers=2, seed=3):
    cfg = drafter_config_dict(target_config(), "dflash2", num_layers=layers, block_size=8)
    return random_drafter(cfg, seed=seed)


def _features(drafter, P, seed=0):
    rng = np.random.default_rng(seed)
    return mx.array(rng.normal(size=(1, P, drafter.fc.weight.shape[1])).astype(np.float32))


def test_drafter_cache_memory_stops_growing():
    drafter = _full_drafter()
    drafter.set_context_window(N)
    cache = drafter.make_cache()
    room = cache[0].room
    feats = _features(drafter, 400)
    rows, sizes = [], []
    for start in range(0, 400, 7):  # chunks as a prefill and decode cycles push them
        drafter.append_context(feats[:, start : start + 7], cache)
        mx.eval([c.state for c in cache])
        rows.append(sum(a.shape[2] for a in cache[0].state[::2]))
        sizes.append(cache_nbytes(DecodeCache([], cache)))
    assert cache[0].offset == 400
    assert max(rows) == SINK_ROWS + N + room == rows[-1]
    assert sizes[-1] == max(sizes) == sizes[len(sizes) // 2]  # flat from well before the end
    assert len(cache[0].keys_and_values()[0][0, 0]) == SINK_ROWS + N


# -- (3) exactly the sink and the latest N rows --------------------------------------------


class CutContext:
    """Every context row keyed at its absolute position, then only `rows` kept."""

    def __init__(self, context: mx.array, rows: list[int]):
        self.context, self.rows, self.P = context, mx.array(rows), context.shape[1]

    def keys_values(self, attn, block=None):
        kc, vc = attn.keys_values(self.context, 0)
        return kc[:, :, self.rows], vc[:, :, self.rows], self.P, None

    with_block = staticmethod(CachedContext.with_block)


def _reference(drafter, block, feats, rows):
    context = drafter.project_context(feats.astype(drafter.activation_dtype))
    h = block.astype(drafter.activation_dtype)
    for layer in drafter.layers:
        h = layer(h, CutContext(context, rows))
    return drafter.norm(h)


@pytest.mark.parametrize("P", [3, SINK_ROWS + N, 57])
def test_windowed_drafter_attends_to_the_sink_and_the_latest_rows(P):
    drafter = _full_drafter()
    rng = np.random.default_rng(1)
    block = mx.array(rng.normal(size=(1, 8, drafter.config.hidden_size)).astype(np.float32))
    feats = _features(drafter, P)
    drafter.set_context_window(N)
    cache = drafter.make_cache()
    split = P // 2  # part pushed ahead (chunked prefill), the rest pending with the draft
    if split:
        drafter.append_context(feats[:, :split], cache)
    got = drafter(block, feats[:, split:], cache)
    kept = sorted(set(range(min(SINK_ROWS, P))) | set(range(max(P - N, 0), P)))
    want = _reference(drafter, block, feats, kept)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    drafter.set_context_window(None)
    everything = drafter(block, feats, drafter.make_cache())
    if P > SINK_ROWS + N:  # rows were dropped: the full drafter differs from the window
        assert not np.allclose(np.array(everything), np.array(got), atol=1e-3)
    else:  # a window larger than the context is simply all rows
        np.testing.assert_allclose(np.array(everything), np.array(got), rtol=1e-4, atol=1e-4)


# -- (4) refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3])
def test_library_refuses_a_window_without_rows(bad):
    with pytest.raises(DFlashError, match="draft window"):
        load_pair("builtin", "builtin", draft_window=bad)
    with pytest.raises(DFlashError):
        _full_drafter().set_context_window(bad)


COMMANDS = {  # each command's own flags, so only --draft-window can be wrong
    "generate": ["-p", "hi", "-m", "4"], "chat": [], "compare": ["-p", "hi", "-m", "4"],
    "bench": ["-m", "4"], "serve": [],
}


@pytest.mark.parametrize("bad", ["0", "-3"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_refuses_a_window_without_rows_in_one_line(cli, command, bad):
    code, out, err = cli([command, "--draft-window", bad, *COMMANDS[command]])
    assert_one_line_error(code, out, err)
    assert f"--draft-window {bad}" in err


def test_cli_generate_with_a_window_prints_the_ar_tokens(cli, builtin):
    ids = _prompt(builtin[1], 300)
    text = builtin[1].decode(ids)
    runs = {}
    for name, flags in {"ar": ["--ar"], "window": ["--draft-window", "8", "--block-size", "8"]}.items():
        code, out, err = cli(["generate", "-p", text, "-m", "24", "--ignore-chat-template", "--json", *flags])
        assert code == 0, err
        runs[name] = parse_one_json(out)
    assert runs["window"]["token_ids"] == runs["ar"]["token_ids"]
    assert len(runs["window"]["prompt_token_ids"]) > SINK_ROWS + 8 + 16  # the window dropped rows


# -- (5) rewinds within the room -----------------------------------------------------------


def test_trim_within_the_room_restores_the_window():
    drafter = _full_drafter(layers=1)
    drafter.set_context_window(N)
    feats = _features(drafter, 60)
    cache = drafter.make_cache()
    drafter.append_context(feats, cache)
    c = cache[0]
    assert c.trim(c.room) == c.room and c.offset == 60 - c.room
    fresh = drafter.make_cache()
    drafter.append_context(feats[:, : 60 - c.room], fresh)
    for a, b in zip(c.keys_and_values(), fresh[0].keys_and_values()):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    with pytest.raises(ValueError, match="cannot rewind"):
        c.trim(N + 1)  # past what is kept: the caller re-prefills (DecodeCache.truncate marks it stale)
    short = SinkWindowCache(N)
    short.update_and_fetch(*[mx.zeros((1, 1, 6, 2))] * 2)  # 6 rows: all kept, back into the sink
    assert short.trim(4) == 4 and short.offset == 2 and short.keys_and_values()[0].shape[2] == 2


def test_multi_turn_continuation_with_the_window_stays_lossless(builtin, windowed):
    pair, tokenizer = builtin
    first = _prompt(tokenizer, 200)
    cache = DecodeCache(windowed[0].target.make_cache(), windowed[0].drafter.make_cache())
    answer, _ = _tokens(windowed[0], tokenizer, first, max_tokens=20, prompt_cache=cache)
    cache.truncate(len(first) + 13)  # the caller keeps part of the answer: a rewind inside the room
    assert not cache.stale
    follow = tokenizer.encode(" def g(y):", add_special_tokens=False)
    turn = [cache.tokens[-1]] + follow
    continued, _ = _tokens(windowed[0], tokenizer, turn, max_tokens=24, prompt_cache=cache)
    whole = first + answer[:13] + follow
    ar, _ = _tokens(pair.without_drafter(), tokenizer, whole, max_tokens=24)
    fresh, _ = _tokens(windowed[0], tokenizer, whole, max_tokens=24)
    assert continued == ar == fresh


def test_serve_prompt_cache_pool_with_the_window(builtin, windowed):
    """A next turn rewinds the pooled entry by a few rows (a hit); a branch far back,
    past the window's room, is read again from the start (a miss); both lossless."""
    from dflash2_mlx.serve.cache_pool import PromptCachePool

    pair, tokenizer = windowed
    pool = PromptCachePool(1 << 30, lambda: DecodeCache(pair.target.make_cache(), pair.drafter.make_cache()))

    def request(ids):
        cache, reused = pool.take(ids)
        got, _ = _tokens(pair, tokenizer, ids[reused - 1:] if reused else ids, max_tokens=16, prompt_cache=cache)
        pool.put(cache)
        assert got == _tokens(builtin[0].without_drafter(), tokenizer, ids, max_tokens=16)[0]
        return got, reused

    first = _prompt(tokenizer, 120)
    answer, _ = request(first)
    edited_end = first + answer[:12] + [7, 8, 9]  # the answer's last rows rewritten: within the room
    _, reused = request(edited_end)
    assert reused == len(first) + 12 and pool.hits == 1
    _, reused = request(first[:40] + [7, 8, 9])  # a branch 80 rows back: past the room
    assert reused == 0 and pool.misses == 2
