"""Tool parameter schemas as grammars: the forced call's grammar, and what a
tool's schema becomes when the grammar engine cannot use all of it.

Agents send schemas written for hosted models (Claude Code's use
`propertyNames`, `$schema`, `format`, ...). A tool is never refused for its
schema: every schema is tried in full once (cached: agents send the same tools
with every request); keywords llguidance does not implement are then ignored
for constraint purposes (its `lenient` option: the call must satisfy every
keyword it does implement), and a schema it cannot compile even so constrains
the call's arguments to a JSON object. The prompt always shows the client's
schema as sent; only the grammar of a forced call is relaxed, and the log says
once which tool was relaxed and how (docs/structured.md, "Tool schemas").
"""

import json
import logging
import re
from functools import lru_cache
from typing import Optional

from ..engine.grammar import JSON_LAYOUT, Grammar
from ..errors import DFlashError
from .errors import ApiError
from .fields import json_type

log = logging.getLogger("dflash2.serve")
JSON_BODY_PARSERS = ("mlx_lm.tool_parsers.json_tools",)
# Where in the forced call's Lark text llguidance met the schema: not the client's concern.
_LARK_PLACE = re.compile(r"^at \d+\(\d+\): (failed to compile JSON schema: )?")
# Tool grammars ignore keywords llguidance does not implement (see the module's docstring).
TOOL_LAYOUT = {**JSON_LAYOUT, "lenient": True}
ANY_OBJECT = {"type": "object"}
_noted: set = set()  # (tool, reason) already in the log


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
                              "arguments": _rebased(grammar_schema(t["function"]),
                                                    f"#/anyOf/{i}/properties/arguments" if len(tools) > 1
                                                    else "#/properties/arguments")}}
              for i, t in enumerate(tools)]
    # Lenient only where a schema needs it: the option is the grammar's, not one schema's.
    layout = TOOL_LAYOUT if any(_needs_lenient(t["function"]) for t in tools) else JSON_LAYOUT
    schema = {**(bodies[0] if len(bodies) == 1 else {"anyOf": bodies}), "x-guidance": layout}
    return f"call: {json.dumps(start)} body {json.dumps(end)}\nbody: %json {json.dumps(schema)}\n"


def _rebased(schema, root: str):
    """`schema` placed at `root` of a larger one: its local references ("#/$defs/x") point there."""
    if isinstance(schema, dict):
        return {k: (root + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebased(v, root))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rebased(v, root) for v in schema]
    return schema


def check_tool_schemas(tools: list, field: str = "parameters") -> None:
    """A 400 naming the first of `tools` (chat shape) whose schema (`field` in the client's
    words) is not a JSON object: the one shape no relaxation can read. Everything else is
    accepted (see the module's docstring)."""
    for i, tool in enumerate(tools):
        fn = tool["function"]
        schema = fn.get("parameters")
        if schema is not None and not isinstance(schema, dict):
            raise ApiError(400, f"tools[{i}] '{_short(fn['name'])}': {field} must be a JSON Schema object, "
                                f"not {json_type(schema)}", f"tools[{i}]")


def grammar_schema(fn: dict) -> dict:
    """The schema a call of function tool `fn` is constrained by: its own where the grammar
    engine compiles it (unimplemented keywords ignored), else any JSON object."""
    schema = fn.get("parameters")
    if not schema:
        return ANY_OBJECT
    try:
        text = json.dumps(schema, sort_keys=True)
    except (RecursionError, ValueError):
        return _relaxed(fn["name"], "it nests too deeply to serialise", whole=True)
    strict, lenient = _schema_errors(text)
    if lenient is not None:
        return _relaxed(fn["name"], lenient, whole=True)
    if strict is not None:
        _relaxed(fn["name"], strict, whole=False)
    return schema


def _needs_lenient(fn: dict) -> bool:
    """Whether this tool's schema compiles only with unimplemented keywords ignored."""
    try:
        strict, lenient = _schema_errors(json.dumps(fn.get("parameters") or {}, sort_keys=True))
    except (RecursionError, ValueError):
        return False
    return strict is not None and lenient is None


def _relaxed(name: str, reason: str, whole: bool) -> dict:
    if (name, reason) not in _noted:
        _noted.add((name, reason))
        if whole:
            log.info(f"tool '{_short(name)}': its schema cannot be a grammar ({reason}); a forced call of it "
                     f"is any JSON object")
        else:
            log.info(f"tool '{_short(name)}': a forced call ignores what the grammar engine does not implement "
                     f"({reason}); the rest of its schema holds")
    return ANY_OBJECT


@lru_cache(maxsize=512)  # agents send the same tools with every request
def _schema_errors(schema_text: str) -> tuple[Optional[str], Optional[str]]:
    """Why the schema does not compile in full, and why not even leniently (one line each; None: it does)."""
    schema = json.loads(schema_text)
    reasons = []
    for layout in (JSON_LAYOUT, TOOL_LAYOUT):
        try:
            Grammar.json_schema({**schema, "x-guidance": layout}).compiled()
            reasons.append(None)
        except DFlashError as e:
            reasons.append(_LARK_PLACE.sub("", str(e).split("cannot be used as a grammar: ", 1)[-1]))
        except RecursionError:
            reasons.append("it nests too deeply")
        if reasons[-1] is None:
            break
    return reasons[0], (reasons[1] if len(reasons) > 1 else None)


def _short(name: str) -> str:
    return name if len(name) <= 64 else name[:61] + "..."
