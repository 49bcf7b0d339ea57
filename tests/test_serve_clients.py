"""`dflash2 serve` against the official `openai` and `anthropic` clients.

A real server subprocess on the built-in pair, on loopback ports chosen now:
T = 0 answers equal `dflash2 generate`'s, seeded sampling repeats, the prompt
cache changes nothing but the prefill, concurrent and cancelled clients leave
it serving, and every bad request gets its protocol's error object.
"""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from serve_helpers import Server, ant, oai

KEY = "test-key-12"
PROMPT = "Write a story about a cat."
MESSAGES = [{"role": "user", "content": PROMPT}]
N = 12  # max_tokens: small, the CPU is shared


def generate_command(prompt: str, n: int) -> list[str]:
    return [sys.executable, "-m", "dflash2_mlx.cli", "generate", "--prompt", prompt, "--max-tokens", str(n), "--json"]


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """Both servers and the `dflash2 generate` reference, started side by side.

    `server`: the defaults (prompt cache on). `locked`: a key, no prompt cache
    (a cold server), a batch of two and a queue of one, short prompts, only its own model name."""
    tmp = tmp_path_factory.mktemp("serve")
    servers = [Server("--max-queue", "64", tmp=tmp, wait=False),
               Server("--api-key", KEY, "--cache-bytes", "0", "--max-queue", "1", "--max-batch", "2", "--max-prompt-tokens", "200",
                      "--strict-model-name", tmp=tmp, wait=False)]
    generate = subprocess.run(generate_command(PROMPT, N), capture_output=True, text=True, timeout=300)
    try:
        assert generate.returncode == 0, generate.stderr
        for s in servers:
            s.wait_ready()
        yield (*servers, json.loads(generate.stdout))
    finally:
        for s in servers:
            code, log = s.stop()
            assert code == 0 and "Traceback" not in log, log  # SIGTERM drains and exits cleanly


@pytest.fixture(scope="module")
def server(started):
    return started[0]


@pytest.fixture(scope="module")
def locked(started):
    return started[1]


@pytest.fixture(scope="module")
def reference(started):
    return started[2]


def test_openai_greedy_equals_generate(server, reference):
    client = oai(server)
    r = client.chat.completions.create(model="builtin", messages=MESSAGES, max_tokens=N, temperature=0)
    assert r.choices[0].message.content == reference["text"]
    assert r.usage.prompt_tokens == len(reference["prompt_token_ids"])
    assert r.usage.completion_tokens == len(reference["token_ids"])
    spec = r.usage.model_extra["dflash2"]
    assert spec["mode"] == "dflash2" and spec["target_passes"] >= 1 and len(spec["acceptance_by_position"]) >= 1
    chunks = list(client.chat.completions.create(
        model="builtin", messages=MESSAGES, max_tokens=N, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference["text"]
    assert chunks[-1].usage.completion_tokens == len(reference["token_ids"])
    # The same prompt again: now mostly read from the prompt cache, same answer.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_anthropic_greedy_equals_generate(server, reference):
    client = ant(server)
    # Temperature defaults to 0 here, as in `dflash2 generate` (this client sends none).
    m = client.messages.create(model="builtin", max_tokens=N, messages=MESSAGES)
    assert m.content[0].text == reference["text"]
    assert m.usage.output_tokens == len(reference["token_ids"])
    with client.messages.stream(model="builtin", max_tokens=N, messages=MESSAGES) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == reference["text"]
    assert final.stop_reason in ("end_turn", "max_tokens")
    # A stop sequence inside the greedy answer ends it there, and is named.
    stop = reference["text"].strip().split()[1]
    m = client.messages.create(model="builtin", max_tokens=N, messages=MESSAGES, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == reference["text"][: reference["text"].index(stop)]


def test_completions_and_models(server, reference):
    client = oai(server)
    assert [m.id for m in client.models.list()] == ["builtin"]
    # The built-in target has no chat template: a raw prompt reads the same ids as `generate`'s.
    r = client.completions.create(model="builtin", prompt=PROMPT, max_tokens=N, temperature=0)
    assert r.choices[0].text == reference["text"]
    assert r.choices[0].finish_reason in ("stop", "length")


def test_seeded_sampling_repeats(server):
    client = oai(server)

    def ask(seed, stream=False):
        kw = dict(model="builtin", messages=MESSAGES, max_tokens=N, temperature=0.9, top_p=0.95, seed=seed)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                           if c.choices)
        return client.chat.completions.create(**kw).choices[0].message.content

    first = ask(7)
    assert ask(7) == first
    assert ask(7, stream=True) == first
    others = {ask(seed) for seed in (8, 9)}
    assert others != {first}  # the seed is honoured, not ignored


def test_three_turns_reuse_the_cache_and_match_a_cold_server(server, locked):
    def converse(client):
        messages, out = [], []
        for turn in ("Tell me about the sea.", "And the mountains?", "Which do you prefer?"):
            messages.append({"role": "user", "content": turn})
            r = client.chat.completions.create(model="builtin", messages=messages, max_tokens=8, temperature=0)
            text = r.choices[0].message.content
            out.append((text, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
            messages.append({"role": "assistant", "content": text})
        return out

    warm, cold = converse(oai(server)), converse(oai(locked, KEY))
    assert [t for t, _, _ in warm] == [t for t, _, _ in cold]
    assert [p for _, p, _ in warm] == [p for _, p, _ in cold]
    assert all(c == 0 for _, _, c in cold)
    # Turns 2 and 3 read at least the previous turn's prompt from the cache.
    assert warm[1][2] >= warm[0][1] - 1 and warm[2][2] >= warm[1][1] - 1
    metrics = httpx.get(server.url + "/metrics").text
    assert server.metric("dflash2_prompt_cache_hits_total") >= 2
    assert server.metric("dflash2_mean_acceptance_length") >= 1.0
    for family in ("dflash2_requests_total", "dflash2_generation_tokens_total", "dflash2_queue_length",
                   "dflash2_prompt_cache_bytes"):
        assert f"# TYPE {family} " in metrics


@pytest.mark.slow
def test_eight_streaming_clients_five_requests_each(server):
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(5)]
    client = oai(server)
    sequential = [client.chat.completions.create(model="builtin", max_tokens=4, temperature=0,
                                                 messages=[{"role": "user", "content": p}]).choices[0].message.content
                  for p in prompts]

    def one_client(_):
        c, texts = oai(server), []
        for p in prompts:
            chunks = c.chat.completions.create(model="builtin", max_tokens=4, temperature=0, stream=True,
                                               messages=[{"role": "user", "content": p}])
            texts.append("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices))
        return texts

    tic = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one_client, range(8)))
    assert time.monotonic() - tic < 240
    assert results == [sequential] * 8  # every request completed (a 5xx raises), outputs as sequential


def test_killed_client_stops_its_generation(server):
    before = server.metric("dflash2_cancelled_total")
    script = (
        "import openai, sys\n"
        f"c = openai.OpenAI(base_url='{server.url}/v1', api_key='x', max_retries=0)\n"
        f"s = c.chat.completions.create(model='builtin', messages={MESSAGES!r}, max_tokens=2000, stream=True)\n"
        "for chunk in s:\n"
        "    if chunk.choices and chunk.choices[0].delta.content:\n"
        "        print('streaming', flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "streaming"
    child.kill()
    child.wait()
    deadline = time.monotonic() + 30
    while server.metric("dflash2_cancelled_total") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metric("dflash2_cancelled_total") == before + 1
    r = oai(server).chat.completions.create(model="builtin", messages=MESSAGES, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1


def test_burst_beyond_the_queue_gets_429(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "builtin", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    barrier = threading.Barrier(8)

    def post(_):
        barrier.wait()
        r = httpx.post(locked.url + "/v1/chat/completions", json=body, headers=auth, timeout=120)
        return r.status_code, r.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    codes = sorted(c for c, _ in answers)
    assert set(codes) == {200, 429} and codes.count(200) >= 3  # two running, one queued at least
    assert all(b["error"]["type"] == "rate_limit_error" for c, b in answers if c == 429)
    assert len({b["choices"][0]["message"]["content"] for c, b in answers if c == 200}) == 1
    assert httpx.post(locked.url + "/v1/chat/completions", json=body, headers=auth, timeout=120).status_code == 200


OPENAI_BAD = [
    # (what, body or raw bytes, status, error type)
    ("malformed JSON", b'{"messages": [', 400, "invalid_request_error"),
    ("not an object", b"[1, 2]", 400, "invalid_request_error"),
    ("messages of the wrong type", {"messages": "hello"}, 400, "invalid_request_error"),
    ("max_tokens of the wrong type", {"messages": MESSAGES, "max_tokens": "ten"}, 400, "invalid_request_error"),
    ("unknown model", {"model": "gpt-9", "messages": MESSAGES}, 404, "not_found_error"),
    ("prompt over --max-prompt-tokens", {"messages": [{"role": "user", "content": "cat " * 400}]}, 400,
     "invalid_request_error"),
    ("negative temperature", {"messages": MESSAGES, "temperature": -1}, 422, "invalid_request_error"),
    ("top_p of zero", {"messages": MESSAGES, "top_p": 0}, 422, "invalid_request_error"),
    ("min_p above one", {"messages": MESSAGES, "min_p": 1.5}, 422, "invalid_request_error"),
    ("max_tokens of zero", {"messages": MESSAGES, "max_tokens": 0}, 422, "invalid_request_error"),
    ("n of two", {"messages": MESSAGES, "n": 2}, 422, "invalid_request_error"),
]


def test_bad_requests_get_error_objects_and_no_generation(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    before = locked.metric("dflash2_generations_total", auth)
    for what, body, status, kind in OPENAI_BAD:
        kw = {"content": body, "headers": {**auth, "content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body, "headers": auth}
        r = httpx.post(locked.url + "/v1/chat/completions", timeout=30, **kw)
        assert r.status_code == status, what
        error = r.json()["error"]
        assert error["type"] == kind and error["message"] and "Traceback" not in r.text, what
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (9 * 2**20) + b'"}]}'
    r = httpx.post(locked.url + "/v1/chat/completions", content=big, headers=auth, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["message"]
    r = httpx.get(locked.url + "/v1/nothing-here", headers=auth)
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    # Anthropic's route answers with Anthropic's error object.
    r = httpx.post(locked.url + "/v1/messages", json={"model": "builtin", "messages": MESSAGES}, headers=auth)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"] == {"type": "invalid_request_error", "message": "'max_tokens' is required"}
    r = httpx.post(locked.url + "/v1/messages", headers=auth,
                   json={"model": "builtin", "max_tokens": 4, "messages": MESSAGES, "temperature": 1.5})
    assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request_error"
    assert locked.metric("dflash2_generations_total", auth) == before
    assert httpx.get(locked.url + "/health").status_code == 200


def test_wrong_api_key_is_401_and_runs_nothing(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    before = locked.metric("dflash2_generations_total", auth)
    with pytest.raises(openai.AuthenticationError) as e:
        oai(locked, "wrong").chat.completions.create(model="builtin", messages=MESSAGES, max_tokens=4)
    assert e.value.status_code == 401
    with pytest.raises(anthropic.AuthenticationError) as e:
        ant(locked, "wrong").messages.create(model="builtin", max_tokens=4, messages=MESSAGES)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
    assert httpx.post(locked.url + "/v1/chat/completions", json={"messages": MESSAGES}).status_code == 401
    assert httpx.get(locked.url + "/metrics").status_code == 401
    assert locked.metric("dflash2_generations_total", auth) == before
    # The right key, through the Anthropic header, works.
    m = ant(locked, KEY).messages.create(model="builtin", max_tokens=2, messages=MESSAGES)
    assert m.usage.output_tokens >= 1
