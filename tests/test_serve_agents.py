"""What agents need from `dflash2 serve`, through the official clients (issue 22).

A real server subprocess on the built-in pair drafting at a fixed block of 8,
so every answer runs inside speculation: structured output validates (the
`jsonschema` library) and, greedy, equals `dflash2 generate --ar` under the
same schema (constrained plain decoding); a response_format the server does
not understand is a 400.
"""

import json
import subprocess
import sys

import httpx
import jsonschema
import openai
import numpy as np
import pytest

from serve_helpers import ant, oai, serving

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 30},
                                           "mode": {"enum": ["train", "car", "plane"]}},
          "required": ["city", "days", "mode"], "additionalProperties": False}
PROMPTS = ["Plan a trip.", "config = ", "def trip():\n    return "]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agents")
    yield from serving("--block-size", "8", "--served-model-name", "dflash2-builtin", "--served-model-name", "fast", tmp=tmp)


def json_schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "trip", "schema": schema, "strict": True}}


def constrained_plain(prompt: str, schema_file, n: int) -> str:
    """`dflash2 generate --ar --json-schema`: constrained plain decoding, through the CLI."""
    out = subprocess.run([sys.executable, "-m", "dflash2_mlx.cli", "generate", "--ar", "--json", "-p", prompt,
                          "-m", str(n), "--json-schema", str(schema_file), "--ignore-chat-template"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["text"]


def test_json_schema_greedy_equals_constrained_plain_decoding(server, tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    client = oai(server)
    for prompt in PROMPTS:
        r = client.completions.create(model="builtin", prompt=prompt, max_tokens=60, temperature=0,
                                      extra_body={"response_format": json_schema_format(SCHEMA)})
        text = r.choices[0].text
        jsonschema.validate(json.loads(text), SCHEMA)
        assert r.choices[0].finish_reason == "stop"
        assert text == constrained_plain(prompt, schema_file, 60), prompt
        assert r.usage.dflash2["drafted"] > 0  # it ran inside speculation


def test_json_schema_sampled_outputs_validate(server):
    client = oai(server)
    for i, prompt in enumerate(PROMPTS):
        r = client.chat.completions.create(model="builtin", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=80, temperature=1.0, seed=i,
                                           response_format=json_schema_format(SCHEMA))
        assert r.choices[0].finish_reason == "stop"  # the schema bounds the answer well inside 80 tokens
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_parses_and_streams(server):
    client = oai(server)
    chunks = client.chat.completions.create(model="builtin", messages=[{"role": "user", "content": "Give JSON."}],
                                            max_tokens=60, temperature=0, stream=True,
                                            response_format={"type": "json_object"})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("fmt", [{"type": "garbage"}, "garbage", {"type": "json_schema", "json_schema": {}},
                                 {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}])
def test_response_formats_it_does_not_understand_are_400(server, fmt):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": "builtin", "messages": [{"role": "user", "content": "x"}], "response_format": fmt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("response_format")


def test_any_model_name_is_served_and_models_lists_the_served_names(server):
    client = oai(server)
    assert [m.id for m in client.models.list().data] == ["dflash2-builtin", "fast"]
    for name in ("claude-3-5-haiku-latest", "gpt-4o", "fast"):
        r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.model == name and r.choices[0].message.content is not None  # echoed, as OpenAI does
    a = ant(server)
    m = a.messages.create(model="claude-sonnet-4-5", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert m.model == "claude-sonnet-4-5" and m.content[0].type == "text"


def test_count_tokens_equals_what_a_messages_call_reads(server):
    a = ant(server)
    kwargs = dict(model="claude-sonnet-4-5", system="You are terse.",
                  messages=[{"role": "user", "content": "count these tokens, please: " + "x " * 17}])
    counted = a.messages.count_tokens(**kwargs).input_tokens
    m = a.messages.create(max_tokens=2, **kwargs)
    assert counted == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 20


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
FILES = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 24}},
         "required": ["path"], "additionalProperties": False}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                  "parameters": WEATHER}},
                {"type": "function", "function": {"name": "read_file", "description": "A file's text",
                                                  "parameters": FILES}}]
SCHEMAS = {"get_weather": WEATHER, "read_file": FILES}


def reassemble(chunks):
    """OpenAI streamed tool-call deltas put back together by index; the finish reason; and
    how many non-empty argument fragments came."""
    calls, finish, fragments = {}, None, 0
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for d in choice.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
            fragments += bool(d.function and d.function.arguments)
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, fragments


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "read_file"}}],
                         ids=["required", "named"])
def test_openai_agent_loop(server, choice):
    client = oai(server)
    messages = [{"role": "user", "content": "What is the weather in Paris? Use a tool."}]
    ask = dict(model="gpt-4o", messages=messages, tools=OPENAI_TOOLS, tool_choice=choice, max_tokens=80,
               temperature=0, parallel_tool_calls=False)
    r = client.chat.completions.create(**ask)
    assert r.choices[0].finish_reason == "tool_calls"
    [call] = r.choices[0].message.tool_calls
    if isinstance(choice, dict):
        assert call.function.name == "read_file"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    streamed, finish, fragments = reassemble(client.chat.completions.create(**ask, stream=True))
    assert finish == "tool_calls" and fragments > 2  # the arguments stream as they are written
    assert [(c["name"], c["arguments"]) for c in streamed] == [(call.function.name, call.function.arguments)]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    answer = client.chat.completions.create(model="gpt-4o", messages=messages, tools=OPENAI_TOOLS, max_tokens=12)
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in ("stop", "length")


def test_tool_choice_none_and_unknown_names(server):
    client = oai(server)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=OPENAI_TOOLS,
                                       tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None
    bad = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": OPENAI_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_anthropic_agent_loop(server, choice):
    a = ant(server)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in OPENAI_TOOLS]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    ask = dict(model="claude-sonnet-4-5", max_tokens=80, messages=messages, tools=tools,
               tool_choice={**choice, "disable_parallel_tool_use": True})
    m = a.messages.create(**ask)
    assert m.stop_reason == "tool_use"
    [use] = [b for b in m.content if b.type == "tool_use"]
    if choice["type"] == "tool":
        assert use.name == "get_weather"
    jsonschema.validate(use.input, SCHEMAS[use.name])
    with a.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(use.name, use.input)]
    messages += [{"role": "assistant", "content": m.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    answer = a.messages.create(model="claude-sonnet-4-5", max_tokens=12, messages=messages, tools=tools)
    assert answer.content[0].type == "text" and answer.stop_reason in ("end_turn", "max_tokens")


RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"], "strict": True} for t in OPENAI_TOOLS]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "read_file"}], ids=["required", "named"])
def test_responses_agent_loop_through_previous_response_id(server, choice):
    client = oai(server)
    first = client.responses.create(model="gpt-5-codex", instructions="Answer with a tool call.",
                                    input="What is the weather in Paris?", tools=RESPONSES_TOOLS, tool_choice=choice,
                                    parallel_tool_calls=False, max_output_tokens=80, temperature=0)
    assert first.status == "completed"
    [call] = [o for o in first.output if o.type == "function_call"]
    if isinstance(choice, dict):
        assert call.name == "read_file"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    with client.responses.stream(model="gpt-5-codex", instructions="Answer with a tool call.",
                                 input="What is the weather in Paris?", tools=RESPONSES_TOOLS, tool_choice=choice,
                                 parallel_tool_calls=False, max_output_tokens=80, temperature=0) as stream:
        arguments = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    [streamed] = [o for o in final.output if o.type == "function_call"]
    assert (streamed.name, json.loads(arguments)) == (call.name, json.loads(call.arguments))
    second = client.responses.create(model="gpt-5-codex", previous_response_id=first.id, tools=RESPONSES_TOOLS,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "sunny, 21 degrees"}], max_output_tokens=12)
    assert second.output and second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(second.id).id == second.id


def test_responses_store_false_and_unknown_ids_are_404(server):
    client = oai(server)
    kept = client.responses.create(model="m", input="hello", store=False, max_output_tokens=3)
    for ask in (lambda: client.responses.retrieve(kept.id),
                lambda: client.responses.create(model="m", previous_response_id=kept.id, input="x"),
                lambda: client.responses.create(model="m", previous_response_id="resp_never", input="x")):
        with pytest.raises(openai.NotFoundError):
            ask()


def test_responses_text_format_json_schema(server):
    client = oai(server)
    r = client.responses.create(model="m", input="Plan a trip.", max_output_tokens=80, temperature=0,
                                text={"format": {"type": "json_schema", "name": "trip", "schema": SCHEMA,
                                                 "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)


@pytest.fixture(scope="module")
def builtin_pair():
    from dflash2_mlx import load_pair

    return load_pair("builtin", "builtin")


def mlx_lm_plain(pair, tokenizer, prompt, n, **logits):
    """Greedy plain decoding by mlx-lm with its logits processors: (tokens, logprob rows)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors

    out = []
    for token, lp in generate_step(mx.array(tokenizer.encode(prompt)), pair.target.model, max_tokens=n,
                                   sampler=lambda x: mx.argmax(x, axis=-1),
                                   logits_processors=make_logits_processors(**logits)):
        out.append((int(token), np.array(lp.astype(mx.float32))))
        if int(token) in tokenizer.eos_token_ids:
            break
    return [t for t, _ in out], [r for _, r in out]


def test_completions_logprobs_equal_plain_decoding(server, builtin_pair):
    pair, tokenizer = builtin_pair
    prompt = "def fib(n):\n    "
    tokens, _ = mlx_lm_plain(pair, tokenizer, prompt, 16)
    r = oai(server).completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == tokenizer.decode(tokens)
    assert len(lp.token_logprobs) == len(tokens)
    # The built-in target computes in bf16 on the CPU, where mlx-lm also takes its log-softmax
    # (rounded to 8 significant bits); the server takes it in fp32 from the same logits. So the
    # reference is the fp32 log-softmax of the target's own logits over the same tokens.
    import mlx.core as mx

    ids = tokenizer.encode(prompt)
    logits = pair.target.model(mx.array([ids + tokens[:-1]]))[0, len(ids) - 1 :].astype(mx.float32)
    rows = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    for got, token, row, top in zip(lp.token_logprobs, tokens, rows, lp.top_logprobs):
        assert abs(got - float(row[token])) < 1e-5
        assert len(top) == 3 and max(top.values()) == pytest.approx(float(row.max()), abs=1e-5)


def test_chat_logprobs_stream_and_whole_agree(server):
    client = oai(server)
    ask = dict(model="m", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=12, temperature=0,
               logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**ask).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(**ask, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in whole]
    assert len(whole) == 12 and all(len(e.top_logprobs) == 2 for e in whole)


@pytest.mark.parametrize("logits", [dict(presence_penalty=2.0), dict(frequency_penalty=1.0),
                                    dict(repetition_penalty=1.6)], ids=["presence", "frequency", "repetition"])
def test_greedy_penalties_equal_penalised_plain_decoding(server, builtin_pair, logits):
    pair, tokenizer = builtin_pair
    prompt = "for i in range(10):\n    "
    tokens, _ = mlx_lm_plain(pair, tokenizer, prompt, 40, **{**logits, **{
        k.replace("penalty", "context_size"): 20 for k in logits}})
    plain, _ = mlx_lm_plain(pair, tokenizer, prompt, 40)
    assert tokens != plain
    r = oai(server).completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0, extra_body=logits)
    assert r.choices[0].text == tokenizer.decode(tokens)
    assert r.usage.dflash2["accepted"] > 0


def test_logit_bias_bans_a_token(server, builtin_pair):
    pair, tokenizer = builtin_pair
    prompt = "import os\nimport "
    plain, _ = mlx_lm_plain(pair, tokenizer, prompt, 20)
    banned = plain[0]
    r = oai(server).completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0,
                                       logit_bias={str(banned): -100}, logprobs=0)
    assert banned not in [tokenizer.encode(t)[0] for t in r.choices[0].logprobs.tokens if t]
    want, _ = mlx_lm_plain(pair, tokenizer, prompt, 20, logit_bias={banned: -100.0})
    assert r.choices[0].text == tokenizer.decode(want)


@pytest.mark.parametrize("body,status,param", [
    ({"n": 2}, 422, "n"), ({"logit_bias": {"x": 1}}, 400, "logit_bias"), ({"logit_bias": {"1": 500}}, 422, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, 422, "logit_bias"), ({"top_logprobs": 3}, 400, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 50}, 422, "top_logprobs"), ({"presence_penalty": 3}, 422, "presence_penalty")])
def test_bad_logits_fields(server, body, status, param):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_anthropic_thinking_parameter(server):
    ok = httpx.post(server.url + "/v1/messages", timeout=60, json={
        "model": "claude-sonnet-4-5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert ok.status_code == 200 and ok.json()["content"][0]["type"] == "text"
    bad = httpx.post(server.url + "/v1/messages", timeout=60, json={
        "model": "claude-sonnet-4-5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "sometimes"}})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
