"""The Responses API's `tools` and `tool_choice`: function tools, namespaces, hosted tools.

Codex sends function tools, a `namespace` group of function tools and hosted tools such as
`web_search` (issue 47). Namespaced functions are offered as "ns.fn" and their calls come back
with `namespace` and `name` apart, as OpenAI's API returns them
(`ResponseFunctionToolCall.namespace`); tools this server cannot run are left out of the prompt
with a note in the log.
"""

import logging
from typing import Optional

from .errors import ApiError
from .fields import get

log = logging.getLogger("dflash2.serve")

# Tools OpenAI's servers run themselves (or whose calls are items this server does not write):
# left out of the prompt with a note in the log, never a 400 (openai.types.responses.ToolParam).
HOSTED_TOOLS = ("web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
                "file_search", "code_interpreter", "image_generation", "mcp", "tool_search", "computer",
                "computer_use_preview", "local_shell", "shell", "apply_patch", "custom", "programmatic_tool_calling")
_noted: set = set()


def read_tools(body: dict) -> tuple[list, dict]:
    """Responses function tools ({"type": "function", "name", "parameters"}) in the chat shape, and
    the namespaced ones' qualified names ("ns.fn" -> ("ns", "fn")). A `namespace` tool's function
    tools are offered as "ns.fn" and their calls come back with `namespace` and `name` apart, as
    OpenAI's API returns them; tools this server cannot run are left out (HOSTED_TOOLS)."""
    out, namespaced = [], {}
    for i, tool in enumerate(get(body, "tools", list, []) or []):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            ns = get(tool, "name", str, required=True, where=where)
            for j, inner in enumerate(get(tool, "tools", list, required=True, where=where)):
                fn = _function(inner, f"{where}.tools[{j}]", qualifier=ns)
                if fn is not None:
                    namespaced[fn["function"]["name"]] = (ns, inner["name"])
                    out.append(fn)
            continue
        fn = _function(tool, where)
        if fn is not None:
            out.append(fn)
    return out, namespaced


def _function(tool, where: str, qualifier: str = "") -> Optional[dict]:
    """One function tool in the chat shape; None (and a note in the log) for a tool it cannot run."""
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
        raise ApiError(400, f"'{where}' must be a tool object with a 'type'", where)
    if tool["type"] != "function":
        if tool["type"] not in _noted:
            _noted.add(tool["type"])
            known = "a tool OpenAI's servers run" if tool["type"] in HOSTED_TOOLS else "a tool type this server does not know"
            log.info(f"'{tool['type']}' tools are left out of the prompt: {known}, not one this server can run")
        return None
    name = get(tool, "name", str, required=True, where=where)
    fn = {k: tool[k] for k in ("description", "parameters") if k in tool}
    return {"type": "function", "function": {"name": f"{qualifier}.{name}" if qualifier else name, **fn}}


def read_tool_choice(body: dict, namespaced: dict):
    """tool_choice as plan_tools reads it; a function named by its own name inside a namespace
    (the SDK's ToolChoiceFunction has only `name`) is that namespaced function."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        inside = [q for q, (_, name) in namespaced.items() if name == choice["name"]]
        return inside[0] if len(inside) == 1 and choice["name"] not in namespaced else choice["name"]
    raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                   "tool_choice")
