"""Response formats beside tools, and tool calls cut by max_tokens (issue 39, items 1 and 5),
through the official clients.

One real server on the built-in pair. A forced call with a response format is the call (the format
waits for the next text answer), not a 400; with tool_choice auto the turn's grammar admits the
model's calls or the format's JSON (a logit bias against the first token of one branch makes the
toy model take the other); Anthropic's `output_config.format` constrains the text or is a 400. A
call cut by max_tokens keeps the arguments the stream sent (chat, Anthropic, Responses alike), a cut
before them leaks no call markup into the text, and a cut Responses item says `incomplete`.
Forced calls are deterministic at T = 0: the grammar writes the tags, the name and the keys.
"""

import json
from pathlib import Path

import anthropic
import openai
import pytest
from pydantic import BaseModel, Field

import dflash2_mlx
from serve_helpers import ant, oai, serving

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                "parameters": WEATHER}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                    "parameters": WEATHER}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12}},
          "required": ["answer"], "additionalProperties": False}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
RESPONSES_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}
# Where a forced call of get_weather is cut (tokens; the grammar writes the head and the keys):
IN_HEAD = (3, 12)  # inside the start tag; inside the name
IN_ARGUMENTS = 36  # after "city" is written, inside "unit"'s value: {"city":"…","unit":"


class Answer(BaseModel):
    answer: str = Field(max_length=12)


def first_tokens(prefix: str) -> dict:
    """logit_bias banning every token of the built-in vocabulary that starts with `prefix`."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(Path(dflash2_mlx.__file__).parent / "builtin/target/tokenizer.json")).get_vocab()
    return {str(i): -100 for text, i in vocab.items() if text.startswith(prefix)}


NO_JSON, NO_CALL = first_tokens("{"), first_tokens("<")  # each branch of the auto grammar starts so


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving("--block-size", "8", tmp=tmp_path_factory.mktemp("formats"))


def streamed_chat(client, **kwargs) -> tuple[str, str, str]:
    """(content, the first call's arguments, finish_reason) of a streamed chat answer."""
    content, arguments, finish = "", "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, arguments, finish


# -- 1: formats and tools together ------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_forced_call_with_response_format_is_the_call(server, stream):
    kwargs = dict(model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice="required", response_format=CHAT_FORMAT,
                  max_tokens=80, temperature=0)
    if stream:
        content, arguments, finish = streamed_chat(oai(server), **kwargs)
    else:
        r = oai(server).chat.completions.create(**kwargs)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        arguments = r.choices[0].message.tool_calls[0].function.arguments
    assert not content and finish == "tool_calls"
    assert set(json.loads(arguments)) == {"city", "unit"}


def test_responses_forced_call_with_text_format_is_the_call(server):
    r = oai(server).responses.create(model="m", input="What is the weather in Paris?", tools=RESPONSES_TOOLS,
                                     tool_choice="required", text=RESPONSES_FORMAT, max_output_tokens=80,
                                     temperature=0)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    assert set(json.loads(r.output[0].arguments)) == {"city", "unit"}


def test_chat_auto_with_response_format_admits_a_call(server):
    # The format's JSON may not start here: a call is the one way left (the format alone: JSON).
    r = oai(server).chat.completions.create(model="m", messages=ASK, tools=CHAT_TOOLS, response_format=CHAT_FORMAT,
                                            max_tokens=80, temperature=0, logit_bias=NO_JSON)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not message.content, message
    assert message.tool_calls[0].function.name == "get_weather"
    assert set(json.loads(message.tool_calls[0].function.arguments)) == {"city", "unit"}


def test_chat_auto_with_response_format_admits_the_json(server):
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in CHAT_TOOLS]  # parse() asks for it
    r = oai(server).chat.completions.parse(model="m", messages=ASK, tools=strict, response_format=Answer,
                                           max_tokens=80, temperature=0, logit_bias=NO_CALL)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert isinstance(r.choices[0].message.parsed, Answer)


def test_responses_auto_with_text_format_admits_a_call_or_the_json(server):
    client, ask = oai(server), dict(model="m", input="What is the weather in Paris?", tools=RESPONSES_TOOLS,
                                    text=RESPONSES_FORMAT, max_output_tokens=80, temperature=0)
    called = client.responses.create(**ask, extra_body={"logit_bias": NO_JSON})
    assert [o.type for o in called.output] == ["function_call"], called.output
    answered = client.responses.create(**ask, extra_body={"logit_bias": NO_CALL})
    assert [o.type for o in answered.output] == ["message"]
    Answer.model_validate_json(answered.output_text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_output_config_format_constrains_the_text(server, stream):
    ask = dict(model="m", max_tokens=60, messages=ASK, output_format=Answer, extra_body={"temperature": 0})
    if stream:
        with ant(server).messages.stream(**ask) as s:
            r = s.get_final_message()
    else:
        r = ant(server).messages.parse(**ask)
    assert r.stop_reason == "end_turn" and isinstance(r.parsed_output, Answer)


def test_anthropic_output_config_format_beside_tools(server):
    client = ant(server)
    forced = client.messages.parse(model="m", max_tokens=80, messages=ASK, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "any"}, output_format=Answer, extra_body={"temperature": 0})
    assert [b.type for b in forced.content] == ["tool_use"] and forced.stop_reason == "tool_use"
    auto = client.messages.create(model="m", max_tokens=80, messages=ASK, tools=ANTHROPIC_TOOLS,
                                  output_config={"format": {"type": "json_schema", "schema": ANSWER}},
                                  extra_body={"temperature": 0})
    if auto.stop_reason == "tool_use":
        assert [b.type for b in auto.content] == ["tool_use"] and set(auto.content[0].input) == {"city", "unit"}
    else:
        Answer.model_validate_json(auto.content[0].text)


@pytest.mark.parametrize("config,param", [
    ({"format": {"type": "text"}}, "output_config.format"),
    ({"format": {"type": "json_schema"}}, "output_config.format.schema"),
    ({"format": {"type": "json_schema", "schema": {"type": "object", "minProperties": "x"}}},
     "output_config.format.schema"),
    ({"task_budget": 100}, "output_config.task_budget"),
], ids=["text", "no-schema", "bad-schema", "unknown-field"])
def test_anthropic_output_config_shapes_not_read_are_400(server, config, param):
    with pytest.raises(anthropic.BadRequestError) as e:
        ant(server).messages.create(model="m", max_tokens=8, messages=ASK, extra_body={"output_config": config})
    assert f"'{param}'" in e.value.message or param in e.value.message


# -- 5: tool calls cut by max_tokens ----------------------------------------------------


def test_chat_cut_call_keeps_the_arguments_the_stream_sent(server):
    kwargs = dict(model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice="required", max_tokens=IN_ARGUMENTS,
                  temperature=0)
    _, streamed, finish = streamed_chat(oai(server), **kwargs)
    assert finish == "length" and streamed.startswith('{"city":"') and streamed.endswith('"unit":"'), streamed
    r = oai(server).chat.completions.create(**kwargs)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content is None
    assert [c.function.arguments for c in r.choices[0].message.tool_calls] == [streamed]


@pytest.mark.parametrize("max_tokens", IN_HEAD, ids=["in-tag", "in-name"])
def test_chat_cut_before_the_arguments_leaks_no_markup(server, max_tokens):
    kwargs = dict(model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice="required", max_tokens=max_tokens,
                  temperature=0)
    content, arguments, finish = streamed_chat(oai(server), **kwargs)
    r = oai(server).chat.completions.create(**kwargs)
    assert (content, arguments, finish) == ("", "", "length")
    assert not r.choices[0].message.content and r.choices[0].finish_reason == "length"


def test_anthropic_cut_call_input_is_the_streamed_input(server):
    kwargs = dict(model="m", max_tokens=IN_ARGUMENTS, messages=ASK, tools=ANTHROPIC_TOOLS,
                  tool_choice={"type": "any"}, extra_body={"temperature": 0})
    with ant(server).messages.stream(**kwargs) as s:
        streamed = s.get_final_message()
    whole = ant(server).messages.create(**kwargs)
    assert whole.stop_reason == streamed.stop_reason == "max_tokens"
    assert [(b.type, b.name, b.input) for b in whole.content] == [(b.type, b.name, b.input) for b in streamed.content]
    assert list(whole.content[0].input) == ["city"]  # the member written whole; "unit" was cut


@pytest.mark.parametrize("max_tokens", IN_HEAD, ids=["in-tag", "in-name"])
def test_anthropic_cut_before_the_arguments_leaks_no_markup(server, max_tokens):
    kwargs = dict(model="m", max_tokens=max_tokens, messages=ASK, tools=ANTHROPIC_TOOLS,
                  tool_choice={"type": "any"}, extra_body={"temperature": 0})
    with ant(server).messages.stream(**kwargs) as s:
        streamed = s.get_final_message()
    whole = ant(server).messages.create(**kwargs)
    assert [(b.type, b.text) for b in whole.content] == [(b.type, b.text) for b in streamed.content] == [("text", "")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_cut_call_is_an_incomplete_item_with_its_arguments(server, stream):
    kwargs = dict(model="m", input="What is the weather in Paris?", tools=RESPONSES_TOOLS, tool_choice="required",
                  max_output_tokens=IN_ARGUMENTS, temperature=0)
    deltas = ""
    if stream:
        events = list(oai(server).responses.create(stream=True, **kwargs))
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        r = events[-1].response
    else:
        r = oai(server).responses.create(**kwargs)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [item] = r.output
    assert item.type == "function_call" and item.status == "incomplete"
    assert item.arguments.startswith('{"city":"') and item.arguments.endswith('"unit":"'), item.arguments
    assert not stream or deltas == item.arguments


@pytest.mark.parametrize("tools", [dict(tools=RESPONSES_TOOLS, tool_choice="required"), dict()],
                         ids=["cut-in-call-name", "cut-text"])
def test_responses_cut_message_is_incomplete(server, tools):
    kwargs = dict(model="m", input="What is the weather in Paris?", max_output_tokens=IN_HEAD[1], temperature=0,
                  **tools)
    whole = oai(server).responses.create(**kwargs)
    streamed = [e.response for e in oai(server).responses.create(stream=True, **kwargs)
                if e.type == "response.incomplete"][0]
    for r in (whole, streamed):
        assert r.status == "incomplete" and [(o.type, o.status) for o in r.output] == [("message", "incomplete")]
        assert "<tool" not in r.output_text


@pytest.mark.parametrize("text", ['{"city":"Par', '{"city":"Paris","unit":"cel', '{"a":12', '{"a":tr', '{"a":[1,{"b":null},',
                                  '{"a":{"b":', '{"a":"x\\"}', '{"a":1.', '{"a":true', '{"a"', ''])
def test_a_cut_input_reads_as_the_anthropic_sdk_reads_the_stream(text):
    from jiter import from_json  # the anthropic SDK's stream accumulator (partial mode)

    from dflash2_mlx.serve.tools import ToolCall

    want = from_json(text.encode(), partial_mode=True) if text else {}
    assert ToolCall("call_x", "f", text, complete=False).input == want
