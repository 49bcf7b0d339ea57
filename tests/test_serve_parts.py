"""The server's parts without HTTP: the prompt-cache pool, the rendering, the
think-tag splitter and the field checks."""

import pytest

from dflash2_mlx.engine.decode.loop import DecodeCache
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.serve.cache_pool import PromptCachePool, cache_nbytes
from dflash2_mlx.serve.errors import ApiError
from dflash2_mlx.serve.fields import check_range, get, stop_list
from dflash2_mlx.serve.render import ReasoningSplitter, conversation_ids, starts_thinking
from dflash2_mlx.text.generate import stream_generate
from helpers import load_pair_for


def run(pair, ids, pool, block_size=None, **kw):
    """One request (a DecodeRequest of `kw`; block_size None: the drafter's fixed block)
    through the pool, as the service does it."""
    pair, tokenizer = pair
    cache, reused = pool.take(ids)
    prompt = ids[reused - 1:] if reused else ids
    request = DecodeRequest(block_size=block_size, **kw)
    tokens = [r.token for r in stream_generate(pair, tokenizer, prompt, request, prompt_cache=cache)]
    pool.put(cache)
    return tokens, reused


@pytest.fixture(scope="module")
def pair():
    target, tokenizer, drafter = load_pair_for("qwen3", "dflash2")
    return Pair.make(target, drafter), tokenizer


def new_cache_for(pair):
    target, drafter = pair[0].target, pair[0].drafter
    return lambda: DecodeCache(target.make_cache(), drafter.make_cache())


def test_pool_reuses_the_longest_prefix_and_changes_no_output(pair):
    pool = PromptCachePool(1 << 30, new_cache_for(pair))
    cold = PromptCachePool(0, new_cache_for(pair))
    turn1 = [5, 9, 13, 2, 7]
    out1, reused = run(pair, turn1, pool, max_tokens=9, block_size=8)
    assert reused == 0 and len(pool) == 1
    # A second turn that extends the first conversation reads it from the cache.
    turn2 = turn1 + out1 + [40, 41, 42]
    out2, reused = run(pair, turn2, pool, max_tokens=9, block_size=8)
    assert reused == len(turn1) + len(out1)
    assert out2 == run(pair, turn2, cold, max_tokens=9, block_size=8)[0]
    # A branch off the first turn reuses only the shared prefix (the entry is rewound).
    branch = turn1 + [50, 51]
    out3, reused = run(pair, branch, pool, max_tokens=9, block_size=8)
    assert reused == len(turn1)
    assert out3 == run(pair, branch, cold, max_tokens=9, block_size=8)[0]
    assert cold.misses == 2 and len(cold) == 0


def test_pool_evicts_least_recently_used_past_its_bytes(pair):
    pool = PromptCachePool(1 << 30, new_cache_for(pair))
    run(pair, [5, 9, 13], pool, max_tokens=3)
    one = pool.nbytes
    assert one > 0
    pool.max_bytes = int(one * 2.5)
    run(pair, [60, 61, 62], pool, max_tokens=3)
    run(pair, [70, 71, 72], pool, max_tokens=3)
    assert len(pool) == 2 and pool.evictions == 1
    # The first conversation was the least recently used: it is gone.
    assert run(pair, [5, 9, 13, 1], pool, max_tokens=2)[1] == 0
    assert pool.nbytes <= pool.max_bytes and pool.nbytes == sum(map(cache_nbytes, pool._entries.values()))


def test_rendering_matches_generate_and_passes_tools_and_kwargs(pair):
    from dflash2_mlx.text.prompt import build_prompt

    _, tokenizer = pair
    messages = [{"role": "user", "content": "hello there"}]
    original = tokenizer.chat_template
    assert conversation_ids(tokenizer, messages)[0] == build_prompt(tokenizer, "hello there")
    tokenizer.chat_template = (
        "{% for t in tools or [] %}[tool {{ t['function']['name'] }}]{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n"
    )
    try:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        _, text = conversation_ids(tokenizer, messages, tools=tools, template_kwargs={"enable_thinking": False})
        assert text.startswith("[tool get_weather][no-think]<|im_start|>user\nhello there")
        tokenizer.chat_template = "{% for m in messages %}{{ m['nope']['x'] }}{% endfor %}"
        with pytest.raises(ApiError) as e:
            conversation_ids(tokenizer, messages)
        assert e.value.status == 400 and "chat template" in e.value.message
    finally:
        tokenizer.chat_template = original


def test_no_template_rendering_is_the_chat_commands(pair):
    from dflash2_mlx.text.prompt import render_conversation

    class NoTemplate:
        chat_template = None

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    text, templated = render_conversation(NoTemplate(), messages)
    assert not templated and text == "Be brief.\n\n\nHi" + "Hello." + "\nBye"


@pytest.mark.parametrize("pieces", [["<think>abc</think>answer"], ["<th", "ink>a", "bc</thi", "nk>ans", "wer"]])
def test_reasoning_splitter(pieces):
    s = ReasoningSplitter("<think>", "</think>")
    reasoning = content = ""
    for p in pieces + [None]:
        r, c = s.flush() if p is None else s.feed(p)
        reasoning, content = reasoning + r, content + c
    assert (reasoning, content) == ("abc", "answer")


def test_reasoning_that_starts_in_the_prompt():
    assert starts_thinking("<|im_start|>assistant\n<think>\n", "<think>", "</think>")
    assert not starts_thinking("<think></think>\n", "<think>", "</think>")
    s = ReasoningSplitter("<think>", "</think>", thinking=True)
    assert s.feed("plan</think>done") == ("plan", "done")
    assert ReasoningSplitter(None, None).feed("<think>x") == ("", "<think>x")


def test_field_checks():
    assert get({"t": 1}, "t", float) == 1.0
    for body, kind in (({"t": "1"}, float), ({"t": True}, int), ({"t": 1.5}, int)):
        with pytest.raises(ApiError) as e:
            get(body, "t", kind)
        assert e.value.status == 400 and e.value.param == "t"
    with pytest.raises(ApiError) as e:
        check_range("top_p", 0.0, 0.0, 1.0, low_open=True)
    assert e.value.status == 422
    assert stop_list({"stop": "x"}, "stop") == ("x",)
    with pytest.raises(ApiError):
        stop_list({"stop": ["a"] * 5}, "stop", limit=4)


def test_serve_refuses_bad_settings_in_one_line_before_loading(cli):
    import socket

    code, _, err = cli(["serve", "--host", "0.0.0.0"])
    assert code == 1 and err.count("\n") == 1 and "--api-key" in err and "--allow-unauthenticated" in err
    code, _, err = cli(["serve", "--cache-bytes", "lots"])
    assert code == 1 and err.count("\n") == 1 and "--cache-bytes" in err
    code, _, err = cli(["serve", "--max-batch", "0"])
    assert code == 1 and err.count("\n") == 1 and "--max-batch 0" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        code, _, err = cli(["serve", "--port", taken.getsockname()[1]])
    assert code == 1 and err.count("\n") == 1 and "--port" in err


def test_protocol_answers_split_thinking_and_carry_usage():
    from dflash2_mlx.engine.sampling import SamplingParams
    from dflash2_mlx.serve import anthropic, openai
    from dflash2_mlx.serve.jobs import Finished, GenerationRequest

    request = GenerationRequest((1, 2, 3), 8, SamplingParams())
    fin = Finished("stop", prompt_tokens=3, completion_tokens=5, cached_tokens=2, eos=True, stats=None)
    call = openai.Call(request, chat=True, stream=False, include_usage=True, think=("<think>", "</think>", False))
    body = openai.Answer(call, "m").whole("<think>plan</think>Paris", fin)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris", "reasoning_content": "plan"}
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2} and body["usage"]["total_tokens"] == 8
    # Streamed, the tags may arrive split across tokens.
    answer = openai.Answer(call, "m")
    chunks = [c for piece in ("<thi", "nk>pl", "an</th", "ink>Par", "is") for c in answer.text_chunks(piece)]
    chunks += answer.text_chunks("", final=True)
    import json
    deltas = [json.loads(c[6:])["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "plan"
    assert "".join(d.get("content", "") for d in deltas) == "Paris"
    a_call = anthropic.Call(request, stream=False, think=("<think>", "</think>", True))
    msg = anthropic.Answer(a_call, "m", tokenizer=None).whole("plan</think>Paris", [7, 8], fin)
    assert [b["type"] for b in msg["content"]] == ["thinking", "text"] and msg["stop_reason"] == "end_turn"
    assert msg["usage"]["input_tokens"] == 1 and msg["usage"]["cache_read_input_tokens"] == 2
