"""`dflash2 serve` under bodies nobody should send, and when its engine fails (issue 35).

A real server on the built-in pair: out-of-range token ids, numbers past what
their C types hold and tool schemas that are not JSON Schemas are each a 4xx
that names the field, and the server answers the next request. A hypothesis
fuzz throws random bodies at every POST route and asserts no 5xx, no hang and
an honest /health. A request whose generation raises (tests/faulty_serve.py: a
logits processor that raises inside the real decode loop) is one 500 of one
line and nothing else; an engine thread that dies makes /health 503 and the
process exit non-zero. A second Ctrl-C stops the server at once, status 130.
"""

import asyncio
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from faulty_serve import FAULT_TOKEN, KILL, RAISE
from serve_bodies import RANDOM, RAW, SHAPED, VOCAB
from serve_helpers import Server, serving

from dflash2_mlx.serve.sampling_fields import COUNT_MAX, SEED_MAX

MESSAGES = [{"role": "user", "content": "Write a story about a cat."}]
VALID = {"prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # --max-tokens 4: a fuzzed body that sets no max_tokens still answers at once
    yield from serving("--max-tokens", "4", tmp=tmp_path_factory.mktemp("robust"), forbidden=("Traceback", "internal error"))


def answers(s: Server) -> None:
    """The server is healthy and answers a valid request."""
    health = httpx.get(s.url + "/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
    r = httpx.post(s.url + "/v1/completions", json=VALID, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text


def error_of(r: httpx.Response) -> str:
    body = r.json()
    return body["error"]["message"]


# == token ids and numbers are checked at the door ==========================================


@pytest.mark.parametrize("route,body,message", [
    ("/v1/completions", {"prompt": [999999]}, f"'prompt'[0] is 999999: token ids must be in [0, {VOCAB - 1}]"),
    ("/v1/completions", {"prompt": [-1]}, f"'prompt'[0] is -1: token ids must be in [0, {VOCAB - 1}]"),
    ("/v1/completions", {"prompt": [VOCAB]}, f"'prompt'[0] is {VOCAB}: token ids must be in [0, {VOCAB - 1}]"),
    ("/v1/completions", {"prompt": [5, 6, 10**30]}, "'prompt'[2] is 100000000000… (31 digits)"),
    ("/v1/dflash/race", {"prompt_token_ids": [5, -1], "max_tokens": 2}, "'prompt_token_ids'[1] is -1"),
])
def test_token_ids_out_of_range_are_400_and_the_next_request_is_answered(server, route, body, message):
    r = httpx.post(server.url + route, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert error_of(r).startswith(message), error_of(r)
    answers(server)


@pytest.mark.parametrize("field,value", [
    ("seed", -1), ("seed", 2**64), ("top_k", 2**31), ("max_tokens", 2**31), ("max_tokens", 0),
    ("temperature", 10**400), ("top_p", 10**30), ("presence_context_size", 2**31),
    ("repetition_penalty", 1e300), ("logprobs", 2**64), ("n", 2**64), ("logit_bias", {"5": 10**400}),
    ("logit_bias", {"12345678901234567890123": 1}), ("logit_bias", {"--5": 1}), ("logit_bias", {"٣": 1}),
])
def test_numbers_out_of_range_are_4xx_naming_the_field(server, field, value):
    body = {**VALID, field: value}
    if field.endswith("context_size"):
        body[field.replace("context_size", "penalty")] = 1.0
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["param"] == field and len(error_of(r).splitlines()) == 1, r.text


@pytest.mark.parametrize("text", [b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}',
                                  b'{"prompt": [' + b"9" * 5000 + b"]}", b"[" * 100_000 + b"]" * 100_000])
def test_bodies_json_does_not_allow_are_400(server, text):
    r = httpx.post(server.url + "/v1/completions", content=text, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and ("not valid JSON" in error_of(r) or "too deeply" in error_of(r)), r.text


def test_the_largest_numbers_allowed_run(server):
    """Counts at their ceiling and the largest seed reach the engine without overflowing."""
    body = {**VALID, "temperature": 1.0, "seed": SEED_MAX, "top_k": COUNT_MAX, "repetition_penalty": 1.1,
            "repetition_context_size": COUNT_MAX, "presence_penalty": 0.5, "presence_context_size": COUNT_MAX}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    stream = {**VALID, "max_tokens": COUNT_MAX, "stream": True}  # capped where the context ends
    with httpx.stream("POST", server.url + "/v1/completions", json=stream, timeout=60) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
    assert "error" not in json.loads(first[6:]), first  # closing the stream cancels the rest
    answers(server)


def test_a_temperature_too_small_for_float32_is_greedy(server):
    """1/T past float32's range made every row NaN: a grammar then met a token it forbids (a 500
    the fuzz found). Below 1e-5 a temperature is greedy, as in vLLM."""
    body = {"input": "0", "max_output_tokens": 6, "text": {"format": {"type": "json_object"}}}
    tiny = httpx.post(server.url + "/v1/responses", json={**body, "temperature": 3.6e-256}, timeout=60)
    greedy = httpx.post(server.url + "/v1/responses", json={**body, "temperature": 0}, timeout=60)
    assert tiny.status_code == greedy.status_code == 200, tiny.text
    assert _texts(tiny) == _texts(greedy)


def test_log_probabilities_under_a_grammar_are_json(server):
    """A token the grammar rules out (log-probability -inf) is not among the likely ones: JSON
    has no -Infinity (it was a 500 whole and invalid JSON streamed; the fuzz found it)."""
    body = {"input": "0", "max_output_tokens": 4, "top_logprobs": 7, "text": {"format": {"type": "json_object"}}}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    entries = r.json()["output"][-1]["content"][0]["logprobs"]
    assert entries and all(t["logprob"] > -1e30 for e in entries for t in e["top_logprobs"]), entries
    chat = {"messages": MESSAGES, "max_tokens": 4, "logprobs": True, "top_logprobs": 7, "stream": True,
            "response_format": {"type": "json_object"}}
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60)
    strict = {"parse_constant": lambda name: pytest.fail(f"{name} in a streamed chunk")}
    chunks = [json.loads(line[6:], **strict) for line in r.text.splitlines() if line.startswith("data: {")]
    assert any((c["choices"] or [{}])[0].get("logprobs") for c in chunks), r.text


def _texts(r: httpx.Response) -> list:
    return [c["text"] for item in r.json()["output"] if item["type"] == "message" for c in item["content"]]


# == tool schemas: refused only when not an object, relaxed where the engine cannot use them ===


def _chat_tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}


def test_a_tool_schema_that_is_not_an_object_is_400(server):
    body = {"messages": MESSAGES, "max_tokens": 2, "tools": [_chat_tool("nope")], "tool_choice": "auto"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    got = r.json()["error"]["message"]
    assert got == "tools[0] 'get_weather': parameters must be a JSON Schema object, not a string", got


# What the real agents send (issue 47: Claude Code's TaskCreate uses propertyNames) and schemas no
# grammar can be made of: each is accepted; a forced call under it is still a JSON object, and
# keeps every keyword the engine implements (the enum below).
PROPERTY_NAMES = {"type": "object", "properties": {
    "status": {"enum": ["pending", "done"]},
    "metadata": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "string"}}},
    "required": ["status"], "additionalProperties": False}


@pytest.mark.parametrize("route,tools", [
    ("/v1/chat/completions", [_chat_tool(PROPERTY_NAMES)]),
    ("/v1/chat/completions", [_chat_tool({"type": "nope"})]),
    ("/v1/responses", [{"type": "function", "name": "get_weather", "parameters": {"required": "city"}}]),
    ("/v1/messages", [{"name": "get_weather", "input_schema": {"properties": {"city": "string"}}}]),
    ("/v1/messages", [{"name": "get_weather", "input_schema": PROPERTY_NAMES}]),
], ids=["chat-propertyNames", "chat-bad-type", "responses-bad-required", "messages-bad-property", "messages-propertyNames"])
def test_tool_schemas_the_engine_cannot_compile_are_relaxed_not_refused(server, route, tools):
    body = {"messages": MESSAGES, "input": "hi", "max_tokens": 120, "max_output_tokens": 120, "tools": tools,
            "tool_choice": "required"}
    if route == "/v1/messages":
        body["tool_choice"] = {"type": "any"}
    r = httpx.post(server.url + route, json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    # (arguments, complete): a schema relaxed to any object may be cut by max_tokens mid-object
    if route == "/v1/chat/completions":
        cut = answer["choices"][0]["finish_reason"] == "length"
        calls = [(c["function"]["arguments"], not cut) for c in answer["choices"][0]["message"]["tool_calls"]]
    elif route == "/v1/responses":
        calls = [(i["arguments"], i["status"] == "completed") for i in answer["output"] if i["type"] == "function_call"]
    else:
        cut = answer["stop_reason"] == "max_tokens"
        calls = [(json.dumps(b["input"]), not cut) for b in answer["content"] if b["type"] == "tool_use"]
    assert calls and all(args.startswith("{") for args, _ in calls), answer
    calls = [json.loads(args) for args, complete in calls if complete]
    assert all(isinstance(c, dict) for c in calls), answer
    schema = (tools[0].get("function") or tools[0]).get("parameters") or tools[0].get("input_schema")
    if schema is PROPERTY_NAMES:  # what the engine implements still holds
        assert calls, answer  # this schema bounds the call well inside max_tokens
        relaxed = json.loads(json.dumps(PROPERTY_NAMES).replace('"propertyNames": {"pattern": "^[a-z]+$"}, ', ""))
        for call in calls:
            jsonschema.validate(call, relaxed)
    assert "a forced call" in server.output()  # the note in the log, once per tool


# == the fuzz (bodies: serve_bodies.py) ====================================================

# The same bodies every run (a failure reproduces); no shrinking: against a server it takes minutes,
# and the failing body is printed as it came.
FUZZ = settings(deadline=None, database=None, derandomize=True, print_blob=True,
                suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
TRIED = {"bodies": 0}


def server_errors(r: httpx.Response) -> list:
    """The 5xx error objects in a streamed answer (they arrive after a 200)."""
    out = []
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        data = json.loads(line[6:])
        error = data.get("error") or (data.get("response") or {}).get("error")
        if isinstance(error, dict) and (error.get("code") in (500, 503, "server_error") or
                                        error.get("type") in ("server_error", "api_error", "overloaded_error")):
            out.append(error)
    return out


def throw(s: Server, client: httpx.Client, route: str, body) -> None:
    """One body: no 5xx (whole or streamed), an answer well within the timeout, /health honest."""
    TRIED["bodies"] += 1
    # Python's json writes NaN and Infinity (httpx's json= refuses them); a server must refuse them itself.
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(s.url + route, content=content, headers={"content-type": "application/json"})
    assert r.status_code < 500, (route, body, r.status_code, r.text[:500])
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
        assert not server_errors(r), (route, body, r.text[-500:])
    health = client.get(s.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok", (route, body, health.text)
    if TRIED["bodies"] % 50 == 0:
        answers(s)


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:  # a hang is a timeout: the test fails
        yield c


@settings(FUZZ, max_examples=160)
@given(SHAPED)
def test_fuzz_bodies_shaped_like_each_route(server, client, case):
    throw(server, client, *case)


@settings(FUZZ, max_examples=100)
@given(st.one_of(RANDOM, RAW))
def test_fuzz_random_json_and_bytes(server, client, case):
    throw(server, client, *case)


def test_fuzz_left_the_server_answering(server):
    print(f"fuzz: {TRIED['bodies']} bodies tried")  # run with -s to see it
    answers(server)


# == a failing generation, a dead engine ===================================================

FAULTY = [sys.executable, str(Path(__file__).parent / "faulty_serve.py")]


@pytest.mark.parametrize("batch", ["4", "1"])  # the batch runner (the default) and one request at a time
def test_a_failing_generation_is_one_500_and_a_dead_engine_exits_non_zero(tmp_path, batch):
    s = Server("--max-batch", batch, tmp=tmp_path, launcher=FAULTY)
    try:
        raising = {**VALID, "logit_bias": {str(FAULT_TOKEN): RAISE}}
        long = {"messages": MESSAGES, "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(1) as pool:
            started = threading.Event()

            def read_long() -> list:
                with client.stream("POST", s.url + "/v1/chat/completions", json=long) as r:
                    lines = []
                    for line in r.iter_lines():
                        lines.append(line)
                        started.set()
                    return lines

            other = pool.submit(read_long)
            assert started.wait(60)
            r = client.post(s.url + "/v1/completions", json=raising)
            lines = other.result(timeout=120)
        # The failing request: one 500 of one line; the one running beside it ran to its end.
        assert r.status_code == 500, r.text
        assert error_of(r) == "internal error: RuntimeError: injected failure in a logits processor", r.text
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert [line for line in lines if line][-1] == "data: [DONE]" and not [c for c in chunks if "error" in c]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
        streamed = httpx.post(s.url + "/v1/chat/completions", timeout=60,
                              json={"messages": MESSAGES, "max_tokens": 3, "stream": True,
                                    "logit_bias": {str(FAULT_TOKEN): RAISE}})
        assert [e["code"] for e in server_errors(streamed)] == [500], streamed.text
        answers(s)

        # The engine thread dies: the request that killed it gets a 503, and the server exits non-zero.
        r = httpx.post(s.url + "/v1/completions", json={**VALID, "logit_bias": {str(FAULT_TOKEN): KILL}}, timeout=60)
        assert r.status_code == 503, r.text
        assert error_of(r).startswith("the engine stopped (EngineKilled: injected: the engine thread ends here)")
        code = s.proc.wait(timeout=60)
    finally:
        s.stop()
    log = s.output()
    assert code == 1, (code, log)
    assert "Traceback" not in log and log.count("generation failed: internal error: RuntimeError") == 2, log
    assert log.rstrip().splitlines()[-1].startswith("error: the engine stopped (EngineKilled: "), log


class EngineKilled(BaseException):
    pass


@pytest.mark.parametrize("max_batch", [2, 1])
def test_a_dead_engine_says_so_on_health_and_answers_503(max_batch):
    """In-process (the library never exits): work that raises a BaseException on the worker
    ends it; the request queued behind gets a 503, /health and every later request too."""
    from starlette.testclient import TestClient

    from dflash2_mlx import load_pair
    from dflash2_mlx.engine.request import DecodeRequest
    from dflash2_mlx.serve.app import create_app
    from dflash2_mlx.serve.service import EngineService
    from dflash2_mlx.serve.settings import ServeSettings

    service = EngineService(lambda: load_pair("builtin", "builtin"), request=DecodeRequest(block_size=None),
                            max_batch=max_batch)
    service.start()
    lines = []
    service.on_failed = lines.append
    client = TestClient(create_app(service, ServeSettings(model_id="builtin")))
    try:
        assert client.get("/health").json()["status"] == "ok"
        release = threading.Event()

        def work(svc):
            release.wait(60)
            raise EngineKilled("the worker ends here")

        async def queue_work():
            return service.submit_task(work)

        asyncio.run(queue_work())
        got = {}
        queued = threading.Thread(target=lambda: got.update(r=client.post("/v1/completions", json=VALID)),
                                  daemon=True)  # a daemon: should it hang, the test fails and pytest still ends
        queued.start()
        deadline = time.monotonic() + 30
        while service.queue_length < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.queue_length == 1
        release.set()
        queued.join(timeout=60)
        assert not queued.is_alive(), "the request queued behind the dying worker hangs"
        r = got["r"]
        assert r.status_code == 503 and "the engine stopped (EngineKilled: the worker ends here)" in error_of(r)
        health = client.get("/health")
        assert health.status_code == 503, health.text
        assert health.json()["status"] == "failed" and health.json()["reason"] == "EngineKilled: the worker ends here"
        later = client.post("/v1/messages", json={"messages": MESSAGES, "max_tokens": 2})
        assert later.status_code == 503 and "the engine stopped" in later.json()["error"]["message"]
        assert lines == ["EngineKilled: the worker ends here"]
    finally:
        release.set()
        service.stop()


# == a second Ctrl-C =======================================================================


def test_a_second_ctrl_c_stops_at_once_with_one_line_and_130(tmp_path):
    s = Server(tmp=tmp_path)
    try:
        # Greedy: the built-in pair writes 2000 tokens here without an end, tens of seconds.
        body = {"messages": MESSAGES, "max_tokens": 2000, "stream": True, "temperature": 0}
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                next(lines)  # it runs
                s.proc.send_signal(signal.SIGINT)  # the first: the drain waits for the stream
                deadline = time.monotonic() + 30
                while "stopping" not in s.output() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert s.proc.poll() is None, s.output()
                tic = time.monotonic()
                s.proc.send_signal(signal.SIGINT)
                code = s.proc.wait(timeout=30)
                took = time.monotonic() - tic
                try:  # the stream was cut: it never ends with [DONE]
                    rest = list(lines)
                except httpx.HTTPError:
                    rest = []
    finally:
        s.stop()
    log = s.output()
    after = log.split("stopping:", 1)[1].splitlines()[1:]
    assert code == 130 and took < 5, (code, took, log)  # a hang guard: it is well under a second
    assert after == ["error: stopped at the second Ctrl-C; 1 request was cut"], log
    assert "Traceback" not in log and "data: [DONE]" not in rest
