"""Agent frameworks against a real `dflash2 serve` (issue 39, part 4).

The OpenAI Agents SDK (chat completions and Responses), instructor, langchain-openai and pydantic-ai
each run one tool loop and one structured-output call on the built-in pair. Its text is gibberish, so
every structure here is the server's grammar at work: a forced tool choice writes the call (the toy
model would not choose one), a response format writes the JSON. Each test asserts that the Python
tool ran with arguments its signature accepts, that the structured result is the pydantic model, and
that the loop ended; the module's server must answer no 5xx and log no traceback. The frameworks are
in the `test` extra; without them these tests skip.
"""

import re
from typing import Annotated, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from serve_helpers import serving

pytestmark = pytest.mark.slow

City = Annotated[str, Field(max_length=8)]  # a short string bounds the forced call's length
Unit = Literal["celsius", "fahrenheit"]
ASK = "What is the weather in Paris? Use the tool."
PLAN = "Plan a trip."
MAX_TOKENS = 96  # a forced call takes about 50 tokens; a free-text answer of the toy model is gibberish


class WeatherArgs(BaseModel):
    """The weather tool's signature, as a model: the recorded arguments must validate against it."""

    # additionalProperties false: without it the schema admits more keys, and the toy model writes
    # them until max_tokens (the grammar follows the schema as given)
    model_config = ConfigDict(extra="forbid")

    city: City
    unit: Unit


class Trip(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=30)
    mode: Literal["train", "car", "plane"]


def weather_tool(calls: list):
    """A fresh `get_weather` that records every call's arguments in `calls`."""

    def get_weather(city: City, unit: Unit) -> str:
        """The weather in a city."""
        calls.append({"city": city, "unit": unit})
        return f"21 degrees {unit} in {city}"

    return get_weather


def ran_once(calls: list) -> WeatherArgs:
    assert len(calls) == 1, calls
    return WeatherArgs.model_validate(calls[0], strict=True)


def is_trip(result) -> Trip:
    assert isinstance(result, Trip), result
    return Trip.model_validate(result.model_dump())  # the constraints hold, not only the type


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving("--block-size", "8", tmp=tmp_path_factory.mktemp("frameworks"))


@pytest.fixture(scope="module", autouse=True)
def no_5xx(server):
    """Every status the server answered in this module, checked after its last test."""
    yield
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    answered = re.findall(r'^dflash2_requests_total\{route="([^"]+)",status="(\d+)"\}', metrics, re.M)
    assert answered and all(status.startswith("2") for _, status in answered), answered  # no 4xx, no 5xx


def async_client(server) -> openai.AsyncOpenAI:
    # one client per test: each `run_sync` runs its own event loop
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


# -- OpenAI Agents SDK -----------------------------------------------------------------------------

@pytest.fixture(params=["chat", "responses"])
def agents_model(request, server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # nothing tries to send traces to OpenAI
    api = {"chat": agents.OpenAIChatCompletionsModel, "responses": agents.OpenAIResponsesModel}[request.param]
    return api(model="builtin", openai_client=async_client(server))


def test_agents_sdk_tool_loop(agents_model):
    import agents

    calls = []
    # Forced on the first turn; the SDK then resets tool_choice to auto, and the loop ends on a
    # final answer. A typed one: the toy model's free text would run to max_tokens, which the SDK
    # takes as a failed Responses turn (`incomplete`), while the format's JSON closes.
    agent = agents.Agent(name="weather", instructions="Answer with the tool.", model=agents_model,
                         tools=[agents.function_tool(weather_tool(calls))], output_type=Trip,
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                             max_tokens=MAX_TOKENS))
    result = agents.Runner.run_sync(agent, ASK, max_turns=4)
    args = ran_once(calls)
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert [o.output for o in outputs] == [f"21 degrees {args.unit} in {args.city}"]
    is_trip(result.final_output)  # the turn after the tool result answered


def test_agents_sdk_structured_output(agents_model):
    import agents

    agent = agents.Agent(name="planner", instructions="Plan a trip.", model=agents_model, output_type=Trip,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=80))
    result = agents.Runner.run_sync(agent, PLAN, max_turns=1)
    is_trip(result.final_output)


# -- instructor ------------------------------------------------------------------------------------

def instructor_client(server, mode):
    instructor = pytest.importorskip("instructor")
    return instructor.from_openai(openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                                                timeout=120), mode=mode)


def test_instructor_tool_loop(server):
    instructor = pytest.importorskip("instructor")
    client = instructor_client(server, instructor.Mode.TOOLS)  # a named, forced tool: the model's schema
    calls = []
    get_weather = weather_tool(calls)
    messages = [{"role": "user", "content": ASK}]
    args, completion = client.chat.completions.create_with_completion(
        model="builtin", messages=messages, response_model=WeatherArgs, temperature=0, max_tokens=MAX_TOKENS,
        max_retries=0)
    call = completion.choices[0].message.tool_calls[0]
    result = get_weather(**args.model_dump())
    ran_once(calls)
    # The tool's result goes back; a plain answer (no response model) closes the loop.
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
                 {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = client.chat.completions.create(model="builtin", messages=messages, response_model=None,
                                           temperature=0, max_tokens=MAX_TOKENS)
    assert final.choices[0].finish_reason in ("stop", "length") and not final.choices[0].message.tool_calls


def test_instructor_structured_output(server):
    instructor = pytest.importorskip("instructor")
    client = instructor_client(server, instructor.Mode.JSON_SCHEMA)  # response_format json_schema
    trip = client.chat.completions.create(model="builtin", messages=[{"role": "user", "content": PLAN}],
                                          response_model=Trip, temperature=0, max_tokens=80, max_retries=0)
    is_trip(trip)


# -- langchain-openai ------------------------------------------------------------------------------

def chat_openai(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(model="builtin", base_url=server.url + "/v1", api_key="x", temperature=0,
                                       max_tokens=MAX_TOKENS, max_retries=0, timeout=120)


def test_langchain_tool_loop(server):
    llm = chat_openai(server)
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    calls = []
    get_weather = tool(weather_tool(calls))
    ask = HumanMessage(ASK)
    # strict: additionalProperties false (see WeatherArgs) and the signature's constraints
    reply = llm.bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke([ask])
    assert [c["name"] for c in reply.tool_calls] == ["get_weather"]
    call = reply.tool_calls[0]
    result = get_weather.invoke(call["args"])
    ran_once(calls)
    final = llm.bind_tools([get_weather], tool_choice="none").invoke(
        [ask, reply, ToolMessage(result, tool_call_id=call["id"])])
    assert not final.tool_calls and not final.invalid_tool_calls
    assert final.response_metadata["finish_reason"] in ("stop", "length")


def test_langchain_structured_output(server):
    llm = chat_openai(server).bind(max_tokens=80)
    trip = llm.with_structured_output(Trip, method="json_schema").invoke(PLAN)
    is_trip(trip)


# -- pydantic-ai -----------------------------------------------------------------------------------

def pydantic_ai_model(server):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("builtin", provider=OpenAIProvider(openai_client=async_client(server)))


def test_pydantic_ai_tool_loop(server):
    model = pydantic_ai_model(server)
    from pydantic_ai import Agent, Tool

    calls = []

    def settings(ctx):
        # the tool forced on the first step only (with auto the toy model answers text and never
        # calls it); the next step answers text, which ends the run
        return {"temperature": 0, "max_tokens": MAX_TOKENS, "tool_choice": "required" if ctx.run_step == 1 else "none"}

    agent = Agent(model, tools=[Tool(weather_tool(calls))], model_settings=settings)
    result = agent.run_sync(ASK)
    args = ran_once(calls)
    returned = [p.content for m in result.all_messages() for p in m.parts if p.part_kind == "tool-return"]
    assert returned == [f"21 degrees {args.unit} in {args.city}"]  # the result went back to the server
    assert isinstance(result.output, str) and result.all_messages()[-1].kind == "response"


@pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
def test_pydantic_ai_structured_output(server, native):
    model = pydantic_ai_model(server)
    from pydantic_ai import Agent, NativeOutput

    # NativeOutput: response_format json_schema; the default: an output tool the model must call
    agent = Agent(model, output_type=NativeOutput(Trip) if native else Trip,
                  model_settings={"temperature": 0, "max_tokens": 80})
    is_trip(agent.run_sync(PLAN).output)
