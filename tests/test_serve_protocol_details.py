"""Protocol details agents trip on (issue 39, items 3, 4 and 6), through the official clients.

One real server on the built-in pair: a forced tool choice without tools is a 400;
a streamed Anthropic answer has the content blocks of the non-streamed one; server
tools are refused; chat chunks carry `usage: null` and a tool call's first chunk
`content: null`; /v1/models speaks both protocols; answers echo the asked model name;
streamed tool-call logprobs leave out the call markup and the end-of-sequence token.
"""

import json
from datetime import datetime

import anthropic
import openai
import pytest

from serve_helpers import Server, ant, oai, serving

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                  "parameters": WEATHER}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving("--block-size", "8", "--served-model-name", "dflash2-builtin", tmp=tmp_path_factory.mktemp("details"))


# -- 3: a forced tool choice needs tools -----------------------------------------------


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_chat_forced_tool_choice_without_tools_is_400(server, choice):
    with pytest.raises(openai.BadRequestError) as e:
        oai(server).chat.completions.create(model="m", messages=ASK, tool_choice=choice, max_tokens=4)
    assert e.value.body["param"] == "tool_choice" and "tools" in e.value.body["message"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}], ids=["required", "named"])
def test_responses_forced_tool_choice_without_tools_is_400(server, choice):
    with pytest.raises(openai.BadRequestError) as e:
        oai(server).responses.create(model="m", input="hi", tool_choice=choice, max_output_tokens=4)
    assert e.value.body["param"] == "tool_choice"


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_anthropic_forced_tool_choice_without_tools_is_400(server, choice):
    with pytest.raises(anthropic.BadRequestError) as e:
        ant(server).messages.create(model="m", max_tokens=4, messages=ASK, tool_choice=choice)
    assert "tool_choice" in e.value.message


def test_tool_choice_auto_and_none_without_tools_still_answer(server):
    for choice in ("auto", "none"):
        r = oai(server).chat.completions.create(model="m", messages=ASK, tool_choice=choice, max_tokens=3)
        assert r.choices[0].message.content is not None


# -- 4: streamed Anthropic blocks are the non-streamed blocks ---------------------------


@pytest.mark.parametrize("ask", [dict(tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}), dict()],
                         ids=["forced-tool", "text"])
def test_anthropic_stream_has_the_blocks_of_the_whole_answer(server, ask):
    kwargs = dict(model="m", max_tokens=60, messages=ASK, extra_body={"temperature": 0}, **ask)
    whole = ant(server).messages.create(**kwargs)
    with ant(server).messages.stream(**kwargs) as stream:
        starts = [(e.index, e.content_block.type) for e in stream if e.type == "content_block_start"]
        final = stream.get_final_message()
    assert starts == [(i, b.type) for i, b in enumerate(whole.content)]
    assert [b.type for b in final.content] == [b.type for b in whole.content]
    if ask:
        assert [b.type for b in whole.content] == ["tool_use"]


# -- 6a: tools Anthropic defines are left out, not refused (issue 47) -----------------------


@pytest.mark.parametrize("tool", [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
                                  {"type": "bash_20250124", "name": "bash"},
                                  {"type": "text_editor_20250124", "name": "str_replace_editor"}],
                         ids=lambda t: t["type"])
def test_anthropic_server_tools_are_left_out_of_the_prompt_with_a_note(server, tool):
    alone = ant(server).messages.count_tokens(model="m", messages=ASK)
    beside = ant(server).messages.count_tokens(model="m", messages=ASK, tools=[tool])
    assert beside.input_tokens == alone.input_tokens  # nothing of it reached the prompt
    with_custom = ant(server).messages.create(model="m", max_tokens=60, messages=ASK, tool_choice={"type": "any"},
                                              tools=[tool, *ANTHROPIC_TOOLS])
    assert [b.name for b in with_custom.content if b.type == "tool_use"] == ["get_weather"]
    assert f"'{tool['type']}' tools are left out of the prompt" in server.output()


def test_responses_hosted_tools_are_left_out_and_namespaced_calls_name_their_namespace(server):
    tools = [{"type": "web_search", "external_web_access": False},
             {"type": "namespace", "name": "weather", "description": "Weather tools",
              "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}]}]
    r = oai(server).responses.create(model="m", input="What is the weather in Paris?", max_output_tokens=60,
                                     tools=tools, tool_choice={"type": "function", "name": "get_weather"})
    calls = [i for i in r.output if i.type == "function_call"]
    assert [(c.namespace, c.name) for c in calls] == [("weather", "get_weather")], r.output
    # The call goes back as the client sends it (namespace beside name) and the turn goes on.
    follow = oai(server).responses.create(model="m", max_output_tokens=8, tools=tools, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "namespace": "weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    assert follow.status in ("completed", "incomplete")
    assert "'web_search' tools are left out of the prompt" in server.output()


def test_anthropic_custom_type_tools_are_read(server):
    m = ant(server).messages.create(model="m", max_tokens=60, messages=ASK, tool_choice={"type": "any"},
                                     tools=[{**ANTHROPIC_TOOLS[0], "type": "custom"}])
    assert [b.type for b in m.content] == ["tool_use"]


# -- 6b: chat stream chunks as OpenAI sends them ----------------------------------------


@pytest.mark.parametrize("ask", [dict(tools=OPENAI_TOOLS, tool_choice="required"), dict()], ids=["tool", "text"])
def test_chat_stream_usage_null_and_tool_call_content_null(server, ask):
    chunks = list(oai(server).chat.completions.create(model="m", messages=ASK, max_tokens=60, temperature=0,
                                                      stream=True, stream_options={"include_usage": True}, **ask))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens > 0
    for chunk in body:
        sent = chunk.to_dict()  # only the keys the server sent
        assert "usage" in sent and sent["usage"] is None
    assert body[0].choices[0].delta.role == "assistant"
    calls = [c.choices[0].delta for c in body if c.choices[0].delta.tool_calls]
    if ask:
        assert "content" in calls[0].to_dict() and calls[0].content is None
    else:
        assert not calls and body[0].choices[0].delta.content is not None


# -- 6c: /v1/models in both shapes ------------------------------------------------------


def test_models_list_in_openai_and_anthropic_shape(server):
    assert [m.id for m in oai(server).models.list().data] == ["dflash2-builtin"]
    assert oai(server).models.retrieve("dflash2-builtin").owned_by == "dflash2-mlx"
    [card] = ant(server).models.list().data
    assert (card.id, card.type, card.display_name) == ("dflash2-builtin", "model", "dflash2-builtin")
    assert isinstance(card.created_at, datetime) and card.created_at.tzinfo is not None
    assert ant(server).models.retrieve("dflash2-builtin").type == "model"


# -- 6d: answers name the model asked for -----------------------------------------------


def test_answers_echo_the_asked_model_name(server):
    name = "gpt-4o-mini"
    assert oai(server).chat.completions.create(model=name, messages=ASK, max_tokens=2).model == name
    assert all(c.model == name for c in oai(server).chat.completions.create(model=name, messages=ASK, max_tokens=2,
                                                                               stream=True))
    assert oai(server).completions.create(model=name, prompt="x", max_tokens=2).model == name
    assert oai(server).responses.create(model=name, input="hi", max_output_tokens=2).model == name
    claude = "claude-sonnet-4-5"
    assert ant(server).messages.create(model=claude, max_tokens=2, messages=ASK).model == claude
    with ant(server).messages.stream(model=claude, max_tokens=2, messages=ASK) as stream:
        assert stream.get_final_message().model == claude


def test_strict_model_name_still_refuses_other_names(tmp_path):
    s = Server("--served-model-name", "only", "--strict-model-name", tmp=tmp_path)
    try:
        with pytest.raises(openai.NotFoundError):
            oai(s).chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)
        assert oai(s).chat.completions.create(model="only", messages=ASK, max_tokens=2).model == "only"
    finally:
        s.stop()


# -- 6e: streamed logprobs of a tool call -----------------------------------------------


def test_streamed_tool_call_logprobs_leave_out_markup_and_eos(server):
    ask = dict(model="m", messages=ASK, tools=OPENAI_TOOLS, tool_choice="required", max_tokens=60, temperature=0,
               logprobs=True, top_logprobs=1)
    whole = oai(server).chat.completions.create(**ask)
    streamed = [e.token for c in oai(server).chat.completions.create(**ask, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    text = "".join(streamed)
    assert streamed and "<tool_call>" not in text and "</tool_call>" not in text and "<|endoftext|>" not in text
    assert json.loads(whole.choices[0].message.tool_calls[0].function.arguments)["city"]
    assert streamed == [e.token for e in whole.choices[0].logprobs.content]
