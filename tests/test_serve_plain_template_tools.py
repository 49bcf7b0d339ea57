"""Tools on a chat template with no tool format (issue 37, part 4: SmolLM2's ChatML), through the
official clients.

The built-in target with its template swapped for plain ChatML (no `tools`, no tool turns) is served
with the built-in drafter. mlx-lm finds no tool parser for it, so the server lists the tools in the
system message and takes the json_tools format (`<tool_call>{"name": …, "arguments": …}</tool_call>`)
as the model's: forced calls (OpenAI "required" / a named function, Responses, Anthropic "any" /
"tool") are the forced-call grammar and come back parsed and valid under the schema; with "auto" a
call the model writes is parsed; the tools and the tool turns of a conversation are in the prompt
(the token counts grow with them). Every test here fails where such a template got no tools (a 422
for forced calls, calls left as text, the same prompt with or without tools).
"""

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

import dflash2_mlx
from serve_helpers import ant, oai, serving

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"],
        "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} somewhere", "parameters": s}}
              for n, s in SCHEMAS.items()]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
ANTHROPIC_TOOLS = [{"name": n, "description": f"{n} somewhere", "input_schema": s} for n, s in SCHEMAS.items()]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def plain_target(folder: Path) -> Path:
    """The built-in target folder with a ChatML template that knows no tools."""
    shutil.copytree(Path(dflash2_mlx.__file__).parent / "builtin/target", folder)
    (folder / "chat_template.jinja").write_text(CHATML)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    yield from serving("--model", str(plain_target(tmp / "target")), "--drafter", "builtin", "--block-size", "8", tmp=tmp)


def valid(name: str, arguments) -> dict:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, SCHEMAS[name])
    return value


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_chat_forced_call_is_a_parsed_call_valid_under_the_schema(server, choice):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    r = oai(server).chat.completions.create(model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice=tool_choice,
                                            parallel_tool_calls=False, max_tokens=80, temperature=0)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not message.content
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0].function
    assert call.name in SCHEMAS and (choice == "required" or call.name == choice)
    valid(call.name, call.arguments)


def test_chat_forced_call_streams(server):
    name, arguments, finish = None, "", None
    named = {"type": "function", "function": {"name": "get_weather"}}
    for chunk in oai(server).chat.completions.create(model="m", messages=ASK, tools=CHAT_TOOLS, stream=True,
                                                     tool_choice=named, max_tokens=80, temperature=0):
        if not chunk.choices:
            continue
        for call in chunk.choices[0].delta.tool_calls or []:
            name = call.function.name or name
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    valid(name, arguments)


def test_responses_forced_call_is_a_function_call_item(server):
    r = oai(server).responses.create(model="m", input="What time is it in Oslo?", tools=RESPONSES_TOOLS,
                                     tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=80,
                                     temperature=0)
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_time"
    valid("get_time", calls[0].arguments)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_anthropic_forced_call_is_a_tool_use_block(server, choice):
    m = ant(server).messages.create(model="m", max_tokens=80, messages=ASK, tools=ANTHROPIC_TOOLS, tool_choice=choice)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) >= 1
    assert all(b.name == choice.get("name", b.name) for b in uses)
    for b in uses:
        valid(b.name, b.input)


def no_json() -> dict:
    """logit_bias banning every token of the built-in vocabulary that starts with '{'."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(Path(dflash2_mlx.__file__).parent / "builtin/target/tokenizer.json")).get_vocab()
    return {str(i): -100 for text, i in vocab.items() if text.startswith("{")}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_parses_a_call_the_model_writes(server, stream):
    """tool_choice auto: a call the model writes is parsed. Beside a response format whose JSON may not
    start (its first token banned), the turn's grammar leaves the call as the one way to answer."""
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    kwargs = dict(model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice="auto", response_format=fmt,
                  parallel_tool_calls=False, max_tokens=80, temperature=0, logit_bias=no_json())
    if stream:
        name, arguments, content, finish = None, "", "", None
        for chunk in oai(server).chat.completions.create(stream=True, **kwargs):
            if not chunk.choices:
                continue
            content += chunk.choices[0].delta.content or ""
            for call in chunk.choices[0].delta.tool_calls or []:
                name = call.function.name or name
                arguments += call.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
    else:
        r = oai(server).chat.completions.create(**kwargs)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        call = r.choices[0].message.tool_calls[0].function
        name, arguments = call.name, call.arguments
    assert finish == "tool_calls" and not content and "<tool_call>" not in (content or "")
    valid(name, arguments)


def test_the_tools_are_in_the_prompt(server):
    """The template ignores `tools`; the server lists them (each tool's schema lengthens the prompt)."""
    count = ant(server).messages.count_tokens
    bare = count(model="m", messages=ASK).input_tokens
    one = count(model="m", messages=ASK, tools=ANTHROPIC_TOOLS[:1]).input_tokens
    two = count(model="m", messages=ASK, tools=ANTHROPIC_TOOLS).input_tokens
    assert bare < one < two
    # A system prompt is merged with the tools section, not a second system turn.
    system = count(model="m", system="Be brief.", messages=ASK, tools=ANTHROPIC_TOOLS).input_tokens
    assert two < system < two + 20
    # OpenAI chat sees the same prompt (its usage counts it).
    r = oai(server).chat.completions.create(model="m", messages=ASK, tools=CHAT_TOOLS, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == two


def test_a_tool_loop_renders_its_calls_and_results(server):
    """An assistant call and its result, then the next turn: both are text in the template's turns."""
    def loop(city: str, result: str) -> list:
        return [*ASK, {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": city, "unit": "celsius"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]

    count = ant(server).messages.count_tokens
    short = count(model="m", messages=loop("Rome", "sun"), tools=ANTHROPIC_TOOLS).input_tokens
    # Longer arguments, or a longer result, lengthen the prompt: both are rendered.
    for longer in (loop("Rome and all of Lazio", "sun"), loop("Rome", "sun, 21 degrees, light wind")):
        assert count(model="m", messages=longer, tools=ANTHROPIC_TOOLS).input_tokens > short
    m = ant(server).messages.create(model="m", max_tokens=8, messages=loop("Rome", "sun"), tools=ANTHROPIC_TOOLS)
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # The same loop through OpenAI chat (assistant tool_calls, a tool message, then a user turn), forced again.
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sun"},
                {"role": "user", "content": "And the time there?"}]
    r = oai(server).chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS, max_tokens=60,
                                            tool_choice={"type": "function", "function": {"name": "get_time"}},
                                            temperature=0)
    call = r.choices[0].message.tool_calls[0].function
    assert call.name == "get_time"
    valid("get_time", call.arguments)


def test_the_rendered_prompt_reads_as_the_generic_format(tmp_path):
    """The rendering itself: one system turn with the section, the call as the model writes it, the
    result as a <tool_response> block in a user turn."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from dflash2_mlx.serve.tool_prompt import render_with_tools

    tokenizer = load_tokenizer(plain_target(tmp_path / "target"))
    messages = [{"role": "system", "content": "Be brief."}, *ASK,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
                {"role": "tool", "tool_call_id": "c", "content": "sun"}]
    _, text = render_with_tools(tokenizer, messages, tuple(CHAT_TOOLS), {})
    assert text.count("<|im_start|>system\n") == 1 and text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(CHAT_TOOLS[0]) in text and "<tool_call>" in text
    # The call as the forced grammar writes it (compact JSON).
    assert ('<|im_start|>assistant\n<tool_call>{"name":"get_weather","arguments":{"city":"Rome"}}</tool_call>'
            '<|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\nsun\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
