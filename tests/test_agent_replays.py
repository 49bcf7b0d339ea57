"""Replays of what real coding agents send, against a real `dflash2 serve` (issue 39).

The bodies in tests/fixtures/agents/ are written from the agents' public source and docs
(each file's `_source` names them), not captured from a service:

- codex_responses.json: OpenAI Codex CLI on the Responses API: streamed, function tools,
  `store: false` with the whole history as input, `function_call` / `function_call_output`
  items; and the `previous_response_id` form.
- claude_code_messages.json: Claude Code on Anthropic messages: system text blocks with
  `cache_control`, `thinking`, `metadata.user_id`, its own model name, a `count_tokens` call
  before each turn, `tool_result` blocks.
- opencode_chat.json / cline_chat.json: chat completions as the AI SDK's openai-compatible
  provider (opencode) and Cline's OpenAI provider send them: streamed, `stream_options.
  include_usage`, tools, assistant `tool_calls` then `role: tool` results.

Each conversation is replayed turn by turn over raw `httpx` streaming (SSE parsed here), the
previous answer's tool call fed back as that agent does (`{{call.*}}` placeholders). The server
drafts at a fixed block of 8, so the answers run inside speculation. Every event is validated by
the official SDK's pydantic types (`openai` / `anthropic` packages, through `TypeAdapter` or
`model_validate`): neither package ships a JSON schema for stream events, so the SDK types are
the schema. On top: the event-order invariants those clients rely on, and the assembled answer
validated as the non-streamed type (`Response`, `Message`, `ChatCompletion`).
"""

import json
import typing
from pathlib import Path

import httpx
import jsonschema
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from serve_helpers import serving

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
AGENTS = ["codex_responses", "claude_code_messages", "opencode_chat", "cline_chat"]


def by_type(union) -> dict:
    """The SDK's event union as {type: model}: each event is validated against the one model
    its `type` names (the union's errors would list every member)."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in members}


RESPONSES_EVENTS, ANTHROPIC_EVENTS = by_type(ResponseStreamEvent), by_type(RawMessageStreamEvent)
RESPONSES_EVENT, ANTHROPIC_EVENT = TypeAdapter(ResponseStreamEvent), TypeAdapter(RawMessageStreamEvent)


def validate_event(models: dict, union: TypeAdapter, event: dict) -> BaseModel:
    assert event["type"] in models, f"{event['type']} is no event type of the SDK"
    models[event["type"]].model_validate(event, strict=True)
    return union.validate_python(event, strict=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # -m 48: Codex sends no max_output_tokens; the server's default bounds its answers.
    yield from serving("--block-size", "8", "-m", "48", tmp=tmp_path_factory.mktemp("replays"))


def fill(value, slots: dict):
    """The fixture value with `{{name}}` placeholders filled; a string that is only a
    placeholder becomes the slot's value itself (an object for `{{call.input}}`)."""
    if isinstance(value, dict):
        return {k: fill(v, slots) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, slots) for v in value]
    if isinstance(value, str) and "{{" in value:
        if value[2:-2] in slots and value.startswith("{{") and value.endswith("}}"):
            return slots[value[2:-2]]
        for name, slot in slots.items():
            value = value.replace("{{" + name + "}}", str(slot))
        assert "{{" not in value, f"no slot for {value!r} (the previous turn made no tool call)"
    return value


def post_sse(url: str, headers: dict, body: dict) -> list[tuple[str, str]]:
    """POST and read the server-sent events: (event name or None, data) in order."""
    events, name, data = [], None, []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line == "":
                if data:
                    events.append((name, "\n".join(data)))
                name, data = None, []
            elif line.startswith("event:"):
                name = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].removeprefix(" "))
    assert not data, "the stream ended inside an event"
    return events


def tool_schemas(body: dict) -> dict:
    out = {}
    for t in body.get("tools", []):
        fn = t.get("function", t)
        out[fn["name"]] = fn.get("parameters", fn.get("input_schema"))
    return out


def check_call(name: str, arguments: dict, body: dict) -> None:
    schemas = tool_schemas(body)
    assert name in schemas, name
    jsonschema.validate(arguments, schemas[name])


# -- Responses (Codex) -----------------------------------------------------------------


def replay_responses(events, body, expect) -> dict:
    raw = [json.loads(data) for _, data in events]
    for (name, _), e in zip(events, raw):
        assert name == e["type"]
        validate_event(RESPONSES_EVENTS, RESPONSES_EVENT, e)
    kinds = [e["type"] for e in raw]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    numbers = [e["sequence_number"] for e in raw]
    assert all(a < b for a, b in zip(numbers, numbers[1:])), "sequence_number increases"
    added, done, text, arguments = {}, {}, {}, {}
    for e in raw[1:-1]:
        i = e.get("output_index")
        if e["type"] == "response.output_item.added":
            assert i == len(added), "output items are added in order"
            added[i] = e["item"]
        elif i is not None:  # every event of an item comes between its added and its done
            assert i in added and i not in done, (e["type"], i)
            if e["type"] == "response.output_item.done":
                done[i] = e["item"]
            elif e["type"] == "response.output_text.delta":
                text[i] = text.get(i, "") + e["delta"]
            elif e["type"] == "response.function_call_arguments.delta":
                arguments[i] = arguments.get(i, "") + e["delta"]
        else:
            assert e["type"] == "response.in_progress", e["type"]
    final = Response.model_validate(raw[-1]["response"], strict=True).model_dump(mode="json", exclude_unset=True)
    assert sorted(done) == sorted(added) and final["status"] in ("completed", "incomplete")
    assert [o for o in raw[-1]["response"]["output"] if o["type"] != "reasoning"] == [done[i] for i in sorted(done)]
    for i, item in done.items():
        assert item["id"] == added[i]["id"] and item["type"] == added[i]["type"]
        if item["type"] == "message":
            assert item["content"][0]["text"] == text.get(i, "")
        else:
            assert item["arguments"] == arguments.get(i, "")
    calls = [o for o in raw[-1]["response"]["output"] if o["type"] == "function_call"]
    if expect == "tool_call":
        assert final["status"] == "completed" and len(calls) == 1 and calls[0]["status"] == "completed", final
        check_call(calls[0]["name"], json.loads(calls[0]["arguments"]), body)
    slots = {"response.id": final["id"]}
    if calls:
        c = calls[0]
        slots.update({"call.id": c["call_id"], "call.name": c["name"], "call.arguments": c["arguments"]})
    return slots


# -- Anthropic messages (Claude Code) ----------------------------------------------------


def replay_messages(events, body, expect) -> dict:
    raw = [json.loads(data) for name, data in events if name != "ping"]
    for e in raw:
        validate_event(ANTHROPIC_EVENTS, ANTHROPIC_EVENT, e)
    kinds = [e["type"] for e in raw]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    message, blocks, open_index, partial = raw[0]["message"], [], None, {}
    for e in raw[1:-2]:
        if e["type"] == "content_block_start":
            assert open_index is None and e["index"] == len(blocks), "blocks open one at a time, indices contiguous"
            open_index = e["index"]
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_index, "a delta belongs to the open block"
            block, delta = blocks[open_index], e["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert delta["type"] == "input_json_delta" and block["type"] == "tool_use", delta
                partial[open_index] = partial.get(open_index, "") + delta["partial_json"]
        else:
            assert e["type"] == "content_block_stop" and e["index"] == open_index, e
            open_index = None
    assert open_index is None and blocks, "every block stops before message_delta"
    for i, text in partial.items():
        blocks[i]["input"] = json.loads(text)
    stop = raw[-2]
    message = {**message, "content": blocks, **stop["delta"],
               "usage": {**message["usage"], "output_tokens": stop["usage"]["output_tokens"]}}
    final = Message.model_validate(message, strict=True)
    uses = [b for b in final.content if b.type == "tool_use"]
    assert (final.stop_reason == "tool_use") == bool(uses)
    if expect == "tool_call":
        assert final.stop_reason == "tool_use" and len(uses) == 1, final
        check_call(uses[0].name, uses[0].input, body)
    assert final.model == body["model"]  # its own model name, echoed
    slots = {"input_tokens": final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)}
    if uses:
        slots.update({"call.id": uses[0].id, "call.name": uses[0].name, "call.input": uses[0].input})
    return slots


# -- chat completions (opencode, Cline) ------------------------------------------------


def replay_chat(events, body, expect) -> dict:
    assert events[-1][1] == "[DONE]"
    raw = [json.loads(data) for _, data in events[:-1]]
    for e in raw:
        ChatCompletionChunk.model_validate(e, strict=True)
    # include_usage: every chunk says usage null, and one last chunk without choices has it.
    assert all("usage" in e and e["usage"] is None for e in raw[:-1]), "usage: null before the usage chunk"
    assert raw[-1]["choices"] == [] and raw[-1]["usage"] is not None
    usage = CompletionUsage.model_validate(raw[-1]["usage"], strict=True)
    content, calls, finish = None, {}, None
    for e in raw[:-1]:
        [choice] = e["choices"]
        assert finish is None, "nothing after the finish_reason chunk but usage"
        delta = choice["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for d in delta.get("tool_calls") or []:
            fn = d.get("function") or {}
            if d["index"] not in calls:  # the AI SDK needs id and name on a call's first delta
                assert d["index"] == len(calls) and isinstance(d.get("id"), str) and d.get("type") == "function"
                assert isinstance(fn.get("name"), str) and fn["name"], d
                calls[d["index"]] = {"id": d["id"], "type": "function",
                                     "function": {"name": fn["name"], "arguments": fn.get("arguments") or ""}}
            else:  # later deltas: arguments only, never "name": null (opencode's provider rejects it)
                assert all(d.get(k, "absent") is not None for k in ("id", "type")), d
                assert "name" not in fn, d  # a repeated name would also be appended by SDK accumulators
                calls[d["index"]]["function"]["arguments"] += fn.get("arguments") or ""
        finish = choice["finish_reason"]
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    final = ChatCompletion.model_validate(
        {"id": raw[0]["id"], "object": "chat.completion", "created": raw[0]["created"], "model": raw[0]["model"],
         "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
         "usage": raw[-1]["usage"]}, strict=True)
    assert final.model == body["model"] and usage.completion_tokens > 0
    assert (finish == "tool_calls") == bool(calls) or finish == "length"
    if expect == "tool_call":
        assert finish == "tool_calls" and len(calls) == 1, final
        check_call(calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"]), body)
    slots = {}
    if calls:
        c = calls[0]
        slots.update({"call.id": c["id"], "call.name": c["function"]["name"],
                      "call.arguments": c["function"]["arguments"]})
    return slots


REPLAY = {"/v1/responses": replay_responses, "/v1/messages": replay_messages, "/v1/chat/completions": replay_chat}


@pytest.mark.parametrize("agent", AGENTS)
def test_agent_replay(server, agent):
    spec = json.loads((FIXTURES / f"{agent}.json").read_text())
    for conversation in spec["conversations"]:
        slots, counted = {}, None
        for turn in conversation:
            path = turn.get("path", spec.get("path"))
            body = fill(turn["body"], slots)
            url = server.url + path
            if path.split("?")[0] == "/v1/messages/count_tokens":
                r = httpx.post(url, json=body, headers=spec["headers"], timeout=60)
                assert r.status_code == 200, r.text
                counted = MessageTokensCount.model_validate(r.json(), strict=True).input_tokens
                continue
            replay = REPLAY[path.split("?")[0]]
            slots = replay(post_sse(url, spec["headers"], body), body, turn["expect"])
            if counted is not None:  # count_tokens counted what the turn then read
                assert slots.pop("input_tokens") == counted
                counted = None
            if path == "/v1/responses" and body.get("store") is False:  # store: false keeps nothing
                assert httpx.get(f"{server.url}/v1/responses/{slots['response.id']}", timeout=10).status_code == 404
