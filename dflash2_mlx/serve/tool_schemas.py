"""Tool parameter schemas as grammars: the forced call's grammar, and the check
every tool's schema gets when a request arrives.

A schema is checked whatever `tool_choice` says: one the grammar engine cannot
compile would otherwise pass with "auto" and fail on a later forced call. The
check is llguidance's own (a dependency; `jsonschema` is only a test extra),
run on the grammar a forced call of that tool would use, so "valid" here means
exactly "usable later".
"""

import json
import re
from functools import lru_cache
from typing import Optional

from ..engine.grammar import JSON_LAYOUT, Grammar
from ..errors import DFlashError
from .errors import ApiError
from .fields import json_type
from .tool_prompt import END, START, prompts_tools

JSON_BODY_PARSERS = ("mlx_lm.tool_parsers.json_tools",)
# Where in the forced call's Lark text llguidance met the schema: not the client's concern.
_LARK_PLACE = re.compile(r"^at \d+\(\d+\): (failed to compile JSON schema: )?")


def forced_call_grammar(tools: list, start: str, end: str, several: bool) -> Grammar:
    """The tags around {"name": NAME, "arguments": {...}} for one of `tools` (or several calls)."""
    return Grammar("lark", f"start: call{'+' if several else ''}\n" + _call_rules(tools, start, end))


def call_or_answer_grammar(tools: list, start: str, end: str, several: bool, answer: Grammar) -> Grammar:
    """Either the calls `forced_call_grammar` admits or the JSON `answer` (a json_schema or
    json_object grammar: a response format) — tool_choice auto beside a response format."""
    schema = json.loads(answer.source) if answer.kind == "json_schema" else {"type": "object"}
    if "x-guidance" not in schema:
        schema = {**schema, "x-guidance": JSON_LAYOUT}
    lark = (f"start: call{'+' if several else ''} | answer\n" + _call_rules(tools, start, end)
            + f"answer: %json {json.dumps(schema)}\n")
    return Grammar("lark", lark)


def _call_rules(tools: list, start: str, end: str) -> str:
    bodies = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
               "properties": {"name": {"const": t["function"]["name"]},
                              "arguments": t["function"].get("parameters") or {"type": "object"}}}
              for t in tools]
    schema = {**(bodies[0] if len(bodies) == 1 else {"anyOf": bodies}), "x-guidance": JSON_LAYOUT}
    return f"call: {json.dumps(start)} body {json.dumps(end)}\nbody: %json {json.dumps(schema)}\n"


def call_tags(tokenizer) -> tuple[Optional[str], Optional[str]]:
    """The tags a forced call sits between, when this model's calls have a JSON body; else (None, None)."""
    parser = getattr(tokenizer, "tool_parser", None)
    start, end = getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None)
    if prompts_tools(tokenizer):  # no tool format: the one this server prompts for (tool_prompt.py)
        return START, END
    if not start or getattr(parser, "__module__", "") not in JSON_BODY_PARSERS:
        return None, None
    return start, end


def check_tool_schemas(tools: list, tokenizer, field: str = "parameters") -> None:
    """A 400 naming the first of `tools` (chat shape) whose schema (`field` in the
    client's words) is not a JSON Schema the grammar engine compiles."""
    start, end = call_tags(tokenizer)
    for i, tool in enumerate(tools):
        fn = tool["function"]
        schema = fn.get("parameters")
        if schema is None:
            continue
        where = f"tools[{i}] '{_short(fn['name'])}': {field}"
        if not isinstance(schema, dict):
            raise ApiError(400, f"{where} must be a JSON Schema object, not {json_type(schema)}", f"tools[{i}]")
        try:
            text = json.dumps(schema, sort_keys=True)
        except RecursionError:
            raise ApiError(400, f"{where} nests too deeply to be used", f"tools[{i}]") from None
        reason = _schema_error(text, start, end)
        if reason is not None:
            raise ApiError(400, f"{where} is not a valid JSON Schema: {reason}", f"tools[{i}]")


@lru_cache(maxsize=512)  # agents send the same tools with every request
def _schema_error(schema_text: str, start: Optional[str], end: Optional[str]) -> Optional[str]:
    """Why the schema cannot be compiled (one line), or None."""
    schema = json.loads(schema_text)
    tool = {"function": {"name": "tool", "parameters": schema}}
    grammar = forced_call_grammar([tool], start, end, False) if start else Grammar.json_schema(schema)
    try:
        grammar.compiled()
    except DFlashError as e:
        return _LARK_PLACE.sub("", str(e).split("cannot be used as a grammar: ", 1)[-1])
    except RecursionError:
        return "it nests too deeply"
    return None


def _short(name: str) -> str:
    return name if len(name) <= 64 else name[:61] + "..."
