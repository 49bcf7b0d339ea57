"""Tools for a chat template that has no tool format (SmolLM2's ChatML, a template-less target).

Where mlx-lm finds no tool parser for the template and the template does not
render `tools` itself, the server gives the model the generic format the best
servers fall back to (llama.cpp's generic handler, Hermes / Qwen 2.5
prompting): the tools' JSON schemas in the system message, with the
instruction to answer a call as `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, and that format — mlx-lm's `json_tools` — is then the
model's for parsing its output and for a forced call's grammar. The template
cannot render the tool turns of a conversation either, so they become text in
its ordinary turns: an assistant's calls as the same `<tool_call>` text, tool
results as `<tool_response>` blocks in a user turn. A template that renders
tools in a format mlx-lm does not know keeps it (its output stays text).
"""

import json
from typing import Optional

from mlx_lm.tool_parsers import json_tools

from .render import conversation_ids

START, END = json_tools.tool_call_start, json_tools.tool_call_end
PARSER = json_tools.parse_tool_call
_PROBE = "dflash2_probe_tool"  # a tool name no template writes unless it renders the tools
_RENDERS: dict = {}  # chat template -> whether it renders tools (agents send tools with every request)


def prompts_tools(tokenizer) -> bool:
    """True when this server must write the tools into the prompt itself: mlx-lm knows no tool
    format for the template, and the template (if any) does not render `tools`."""
    if getattr(tokenizer, "tool_call_start", None) and getattr(tokenizer, "tool_parser", None) is not None:
        return False
    return not _template_renders_tools(tokenizer)


def _template_renders_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    key = template if isinstance(template, str) else id(template)
    if key not in _RENDERS:
        probe = [{"type": "function", "function": {"name": _PROBE, "description": "",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                 add_generation_prompt=True, tools=probe)
        except Exception:  # a template that fails on tools does not render them
            text = ""
        _RENDERS[key] = _PROBE in str(text)
    return _RENDERS[key]


def render_with_tools(tokenizer, messages: list[dict], tools: tuple,
                      template_kwargs: Optional[dict]) -> tuple[list[int], str]:
    """(prompt ids, text) of a conversation with `tools` (OpenAI function tools; empty: none
    listed), in the template's format or, where it has none, in the text format above."""
    if not prompts_tools(tokenizer):
        return conversation_ids(tokenizer, messages, tools=list(tools) or None, template_kwargs=template_kwargs)
    return conversation_ids(tokenizer, tools_as_text(messages, tools), template_kwargs=template_kwargs)


def tools_as_text(messages: list[dict], tools: tuple) -> list[dict]:
    """`messages` with the tools section in the (first) system message, calls and results as text."""
    out: list[dict] = []
    responses = False  # the last message is a user turn that holds tool responses
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            content = m.get("content") or ""
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif m["role"] == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if responses:  # results of one round share one user turn
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
            responses = True
            continue
        elif m["role"] == "user" and responses:  # text sent beside the results joins their turn
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + (m.get("content") or "")}
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id", "name")})
        responses = False
    if tools:
        section = tools_section(tools)
        if out and out[0]["role"] == "system":
            system = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{system}\n\n{section}" if system else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def tools_section(tools: tuple) -> str:
    """The system message's section that lists the tools and says how to call one."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments "
            f'within {START}{END} XML tags:\n{START}{{"name": <function-name>, "arguments": '
            f"<args-json-object>}}{END}")


def _call_text(call: dict) -> str:
    """One call of an assistant turn as the model writes it: compact, the forced grammar's layout
    (arguments a client sent as text that is not JSON stay as they are)."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = fn.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False, separators=(",", ":"))
    name = json.dumps(fn.get("name", ""), ensure_ascii=False)
    return f'{START}{{"name":{name},"arguments":{arguments}}}{END}'
