"""Hypothesis strategies of request bodies for every POST route of `dflash2 serve`
(the fuzz in test_serve_robustness.py).

`SHAPED`: a body valid for its route (so that most reach the engine and run,
streamed or not, with tools, formats, penalties and seeds), with up to three
fields replaced by anything (a wrong type, a number at or past a bound, a
broken schema, a token id outside the vocabulary). `RANDOM`: any JSON value, or an
object of the routes' field names holding anything. `RAW`: bytes.
Counts stay small where valid: a valid large one only makes the run slow.
"""

from hypothesis import strategies as st

VOCAB = 4096  # the built-in target's
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
          "/v1/messages/count_tokens", "/v1/dflash/race")

# -- anything -------------------------------------------------------------------------------
SMALL = st.integers(1, 6)
BIG_INTS = st.sampled_from([-1, 0, VOCAB - 1, VOCAB, 999999, 2**31 - 1, 2**31, 2**63, 2**64, -2**63, 10**30,
                            10**400])
# Numbers at and past every bound: C types, the vocabulary, floats (NaN and Infinity go out as
# Python's json writes them, which JSON does not allow).
EDGES = st.sampled_from([-1, 0, VOCAB - 1, VOCAB, 2**31 - 1, 2**31, 2**63, 2**64, 10**30, 10**400, -10**400, 5e-324,
                         1e308, -1e308, float("inf"), float("-inf"), float("nan"), 0.5, 2.5, -2.0000001])
# The same for a count of tokens to write, whose valid large values would only make the run slow.
COUNT_EDGES = st.sampled_from([-1, 0, 2**31, 2**64, 10**400, -10**400, 1.5, float("inf"), float("nan"), "4", True])
NUMBERS = st.one_of(st.integers(), BIG_INTS, EDGES, st.floats(allow_nan=False, allow_infinity=False))
SCALARS = st.none() | st.booleans() | NUMBERS | st.text(max_size=12)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=12)
TEXT = st.text(max_size=40)
WORDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)

# -- valid values ----------------------------------------------------------------------------
GOOD_SCHEMAS = st.sampled_from([
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, {}, {"type": "object"},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}},
])
BAD_SCHEMAS = st.one_of(st.sampled_from([{"type": "nope"}, {"required": "city"}, {"properties": {"a": 1}},
                                         {"anyOf": []}, {"$ref": "#/nowhere"}, {"pattern": "("}, "nope", 5]),
                        st.dictionaries(st.sampled_from(["type", "properties", "required", "items", "enum", "anyOf",
                                                         "minimum", "pattern"]), JSON, max_size=3))
NAMES = st.sampled_from(["get_weather", "list_files"])
CHAT_TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": NAMES}, optional={"parameters": GOOD_SCHEMAS, "description": TEXT})}), min_size=1, max_size=2)
FORMATS = st.one_of(st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
                    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                        {"name": st.just("answer"), "schema": GOOD_SCHEMAS})}))
SAMPLING = {"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 50) | st.just(-1),
            "min_p": st.floats(0, 1), "seed": st.integers(0, 2**64 - 1), "stream": st.booleans()}
LOGITS = {"logit_bias": st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100), max_size=3),
          "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
          "repetition_penalty": st.floats(0.5, 2), "repetition_context_size": SMALL | st.just(2**31 - 1),
          "presence_context_size": SMALL}
TURN = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": WORDS})
CHAT_MESSAGES = st.lists(TURN, min_size=0, max_size=2).map(lambda ms: ms + [{"role": "user", "content": "Hi."}])
TEXT_BLOCKS = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": WORDS}), min_size=1, max_size=2)
ANTHROPIC_MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                                     "content": WORDS | TEXT_BLOCKS}), max_size=2).map(
    lambda ms: ms + [{"role": "user", "content": "Hi."}])
ANTHROPIC_TOOLS = st.lists(st.fixed_dictionaries({"name": NAMES, "input_schema": GOOD_SCHEMAS}), min_size=1, max_size=2)

GOOD = {
    "/v1/chat/completions": ({"messages": CHAT_MESSAGES, "max_tokens": SMALL}, {
        **SAMPLING, **LOGITS, "model": st.just("builtin"), "max_completion_tokens": SMALL, "stop": st.lists(WORDS, max_size=4),
        "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20), "n": st.just(1),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "tools": CHAT_TOOLS,
        "tool_choice": st.sampled_from(["auto", "none", "required"]), "parallel_tool_calls": st.booleans(),
        "response_format": FORMATS, "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()})}),
    "/v1/completions": ({"prompt": WORDS | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
                         "max_tokens": SMALL}, {
        **SAMPLING, **LOGITS, "stop": st.lists(WORDS, max_size=4), "logprobs": st.integers(0, 5), "echo": st.just(False),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})}),
    "/v1/responses": ({"input": WORDS | CHAT_MESSAGES, "max_output_tokens": SMALL}, {
        **SAMPLING, **LOGITS, "instructions": WORDS, "store": st.booleans(), "top_logprobs": st.integers(0, 20),
        "tools": CHAT_TOOLS.map(lambda ts: [{"type": "function", **t["function"]} for t in ts]),
        "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "text": st.fixed_dictionaries({"format": FORMATS.map(lambda f: {**f, **f.get("json_schema", {})})})}),
    "/v1/messages": ({"messages": ANTHROPIC_MESSAGES, "max_tokens": SMALL}, {
        **SAMPLING, "temperature": st.floats(0, 1), "system": WORDS | TEXT_BLOCKS, "stop_sequences": st.lists(WORDS, max_size=3),
        "tools": ANTHROPIC_TOOLS, "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}]),
        "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"])}),
        "output_config": st.fixed_dictionaries({"format": st.fixed_dictionaries(
            {"type": st.just("json_schema"), "schema": GOOD_SCHEMAS})})}),
    "/v1/messages/count_tokens": ({"messages": ANTHROPIC_MESSAGES}, {"system": WORDS, "tools": ANTHROPIC_TOOLS}),
    "/v1/dflash/race": ({"prompt": WORDS, "max_tokens": SMALL}, {
        "temperature": st.floats(0, 2), "seed": st.integers(0, 2**64 - 1)}),
}

# -- what replaces a field ---------------------------------------------------------------------
BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "input_text", "tool_use", "tool_result", "thinking", "image"]) | JSON},
    optional={"text": TEXT | JSON, "name": TEXT | JSON, "input": JSON, "id": TEXT | JSON, "tool_use_id": TEXT | JSON,
              "content": TEXT | JSON})
CONTENT = st.one_of(TEXT, st.lists(BLOCK, max_size=3), JSON)
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "bot"]) | JSON
TOOL_CALL = st.fixed_dictionaries({"id": TEXT, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": TEXT | JSON, "arguments": st.just('{"city": "Paris"}') | TEXT | JSON})})
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": CONTENT},
                                optional={"tool_calls": st.lists(TOOL_CALL | JSON, max_size=2) | JSON,
                                          "name": TEXT | JSON, "tool_call_id": TEXT})
ITEM = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"]) | JSON},
    optional={"role": ROLES, "content": CONTENT, "call_id": TEXT | JSON, "name": TEXT | JSON,
              "arguments": TEXT | JSON, "output": JSON})
ANY_TOOLS = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": NAMES | TEXT | JSON}, optional={"parameters": GOOD_SCHEMAS | BAD_SCHEMAS})}),
    st.fixed_dictionaries({"type": st.just("function"), "name": NAMES | JSON},
                          optional={"parameters": GOOD_SCHEMAS | BAD_SCHEMAS}),
    st.fixed_dictionaries({"name": NAMES | JSON}, optional={"input_schema": GOOD_SCHEMAS | BAD_SCHEMAS}), JSON),
    max_size=3)
ANY_FORMAT = st.one_of(FORMATS, st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
    {"name": TEXT, "schema": BAD_SCHEMAS})}), st.just({"type": "regex"}), JSON)
IDS = st.lists(st.one_of(st.integers(0, VOCAB - 1), BIG_INTS, SCALARS), max_size=5)
# A count that is not valid, or a small one.
COUNT = st.one_of(SMALL, st.integers(max_value=0), st.integers(min_value=2**31), COUNT_EDGES, st.text(max_size=4))
ANYTHING = {
    "model": TEXT | JSON, "messages": st.lists(MESSAGE, max_size=3) | JSON, "prompt": TEXT | IDS | JSON,
    "prompt_token_ids": IDS | JSON, "input": TEXT | st.lists(MESSAGE | ITEM | JSON, max_size=3) | JSON,
    "system": TEXT | CONTENT, "instructions": TEXT | JSON,
    "max_tokens": COUNT, "max_completion_tokens": COUNT, "max_output_tokens": COUNT,
    "temperature": NUMBERS | JSON, "top_p": NUMBERS | JSON, "top_k": NUMBERS | JSON, "min_p": NUMBERS | JSON,
    "seed": NUMBERS | JSON, "n": NUMBERS | JSON, "best_of": NUMBERS, "echo": JSON, "suffix": JSON,
    "stream": JSON, "stream_options": st.fixed_dictionaries({"include_usage": JSON}) | JSON,
    "stop": TEXT | st.lists(TEXT, max_size=6) | JSON, "stop_sequences": st.lists(TEXT, max_size=3) | JSON,
    "logprobs": NUMBERS | JSON, "top_logprobs": NUMBERS | JSON,
    "logit_bias": st.dictionaries(st.integers().map(str) | TEXT, NUMBERS | JSON, max_size=3) | JSON,
    "presence_penalty": NUMBERS, "frequency_penalty": NUMBERS, "repetition_penalty": NUMBERS,
    "presence_context_size": COUNT, "frequency_context_size": COUNT, "repetition_context_size": COUNT,
    "tools": ANY_TOOLS | JSON, "tool_choice": JSON | st.sampled_from(["any", {"type": "tool", "name": "nope"}]),
    "parallel_tool_calls": JSON, "response_format": ANY_FORMAT, "text": st.fixed_dictionaries({"format": ANY_FORMAT}),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]), JSON, max_size=2) | JSON,
    "thinking": JSON, "previous_response_id": TEXT | JSON, "store": JSON, "metadata": JSON,
    "output_config": st.fixed_dictionaries({}, optional={"format": ANY_FORMAT | st.fixed_dictionaries(
        {"type": st.just("json_schema"), "schema": GOOD_SCHEMAS | BAD_SCHEMAS}), "effort": TEXT | JSON}) | JSON,
    "output_format": ANY_FORMAT | JSON,
}
FIELD_NAMES = sorted(ANYTHING)
COUNTS = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
NUMERIC = ["temperature", "top_p", "top_k", "min_p", "seed", "n", "best_of", "logprobs", "top_logprobs",
           "presence_penalty", "frequency_penalty", "repetition_penalty", "presence_context_size",
           "frequency_context_size", "repetition_context_size"]
# Half the changes put a number at an edge into a numeric field (logit_bias's keys and values too).
EDGE_CHANGE = st.one_of(
    st.tuples(st.sampled_from(NUMERIC), EDGES), st.tuples(st.sampled_from(COUNTS), COUNT_EDGES),
    st.tuples(st.just("logit_bias"), st.dictionaries(st.integers(0, VOCAB - 1).map(str) | EDGES.map(str), EDGES,
                                                     min_size=1, max_size=2)))
MUTATIONS = st.lists(st.one_of(EDGE_CHANGE, st.sampled_from(FIELD_NAMES).flatmap(
    lambda k: st.tuples(st.just(k), ANYTHING[k]))), max_size=3).map(dict)


def shaped(route: str):
    required, optional = GOOD[route]
    valid = st.fixed_dictionaries(required, optional=optional)
    return st.tuples(st.just(route), st.builds(lambda body, changes: {**body, **changes}, valid, MUTATIONS))


SHAPED = st.sampled_from(ROUTES).flatmap(shaped)
RANDOM = st.tuples(st.sampled_from(ROUTES), JSON | st.dictionaries(st.sampled_from(FIELD_NAMES), JSON, max_size=5))
RAW = st.tuples(st.sampled_from(ROUTES), st.binary(max_size=80))
