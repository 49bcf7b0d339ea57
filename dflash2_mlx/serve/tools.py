"""Tool calls in the model's own format, for both protocols.

The format comes from mlx-lm: its tokenizer wrapper finds the model's tool
parser from the chat template (`mlx_lm/tool_parsers/`) and holds the tags a
call sits between (`tool_call_start`, `tool_call_end`). This module never
parses a call itself: it cuts the output at those tags and hands each call's
text to mlx-lm's parser. A forced call (OpenAI `tool_choice` "required" or a
named function, Anthropic "any" or "tool") is a grammar: the tags around JSON
valid under the tools' parameter schemas, decoded inside speculation like any
structured output. That needs a format whose call body is JSON (mlx-lm's
json_tools: Qwen 2.5 / 3, the built-in pair); others answer forced calls with
a 422 that says so. A template with no tool format at all (SmolLM2's ChatML)
gets the tools as text in its system message and json_tools as its format
(tool_prompt.py).

A response format beside tools follows OpenAI's rule (`ToolPlan.turn_grammar`):
a forced call is the call, and the format waits for the next text answer; with
tool_choice auto the turn's grammar admits either the model's calls or the
format's JSON.
"""

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Optional

from ..engine.grammar import Grammar
from .errors import ApiError
from .partial_json import partial_object
from .render import partial_suffix
from .structured import checked
from . import tool_prompt
from .tool_schemas import JSON_BODY_PARSERS, call_or_answer_grammar, check_tool_schemas, forced_call_grammar


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object's text, as both protocols send it
    complete: bool = True  # False: the answer ended inside the call (its arguments as far as written)

    @property
    def input(self) -> dict:
        """The arguments as an object; a cut call's as far as they parse (as the anthropic SDK
        reads the streamed input_json_delta pieces: complete members only)."""
        try:
            value = json.loads(self.arguments)
        except json.JSONDecodeError:
            value = partial_object(self.arguments)
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools mean for one generation."""

    tools: tuple = ()  # OpenAI function tools, for the template (empty: none rendered)
    parse: bool = False  # cut tool calls out of the output
    grammar: Optional[Grammar] = None  # a forced call
    start: Optional[str] = None
    end: Optional[str] = None
    parser: Optional[object] = field(default=None, compare=False)
    several: bool = True  # parallel calls allowed

    def turn_grammar(self, answer: Optional[Grammar], param: str) -> Optional[Grammar]:
        """The grammar of the whole turn beside a response format's `answer` (`param`: its field,
        for a 400): a forced call is the call; with auto, a model whose calls are JSON may write
        either its calls or the format's JSON; a model whose call format is not JSON answers in
        the format (its calls cannot be a grammar)."""
        if self.grammar is not None or answer is None:
            return self.grammar
        if not (self.parse and self.start and getattr(self.parser, "__module__", "") in JSON_BODY_PARSERS):
            return answer
        both = call_or_answer_grammar(list(self.tools), self.start, self.end, self.several, answer)
        return checked(both, param)

    def split(self, text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """(the text outside calls, the calls) of a whole answer (`cut`: by max_tokens)."""
        if not self.parse or not self.start:
            return text, []
        streamer = ToolStreamer(self)
        pieces = streamer.feed(text) + streamer.flush(cut)
        content = "".join(p for p in pieces if isinstance(p, str))
        return content, [p for p in pieces if isinstance(p, ToolCall)]


def plan_tools(tokenizer, tools: list, choice, parallel: bool = True, schema_field: str = "parameters") -> ToolPlan:
    """`tools`: OpenAI function tools ({"type": "function", "function": {...}}); `choice`:
    "none" | "auto" | "required" | a function name (forced) | None (auto when tools).
    Every tool's schema is checked first, whatever the choice (`schema_field`: its
    name in the client's protocol, for the 400)."""
    check_tool_schemas(tools, schema_field)
    if not tools and choice not in (None, "auto", "none"):
        # Dropping the choice would answer in plain text where the client waits for a call.
        forced = "a tool call" if choice == "required" else f"a call of '{choice}'"
        raise ApiError(400, f"tool_choice forces {forced} but the request has no 'tools': send the tools "
                            f"a call may use, or tool_choice 'auto'", "tool_choice")
    if not tools or choice == "none":
        return ToolPlan()
    names = [t["function"]["name"] for t in tools]
    if choice not in (None, "auto", "required") and choice not in names:
        raise ApiError(400, f"tool_choice names '{choice}', which is not among the tools ({', '.join(names)})",
                       "tool_choice")
    start, end = getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None)
    parser = getattr(tokenizer, "tool_parser", None)
    if tool_prompt.prompts_tools(tokenizer):  # no tool format: the tools go in as text, calls as json_tools
        start, end, parser = tool_prompt.START, tool_prompt.END, tool_prompt.PARSER
    if not start or parser is None:
        if choice in (None, "auto"):
            return ToolPlan(tuple(tools))  # rendered for the model; its output stays text
        raise ApiError(422, "this model's chat template renders tools in a format mlx-lm does not know, so a "
                            "call cannot be forced: use tool_choice 'auto' or 'none'", "tool_choice")
    grammar = None
    if choice not in (None, "auto"):
        if getattr(parser, "__module__", "") not in JSON_BODY_PARSERS:
            raise ApiError(422, f"forcing a tool call needs a JSON call format; this model's is "
                                f"{getattr(parser, '__module__', '?').rsplit('.', 1)[-1]}: use tool_choice 'auto'",
                           "tool_choice")
        chosen = [t for t in tools if choice == "required" or t["function"]["name"] == choice]
        grammar = checked(forced_call_grammar(chosen, start, end, parallel and choice == "required"), "tools")
    return ToolPlan(tuple(tools), True, grammar, start, end, parser, parallel)


@dataclass(frozen=True)
class CallStart:
    """A call's head, streamed before its arguments: its id and name."""

    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    """The next piece of the open call's arguments text."""

    id: str
    text: str


# The head of a JSON-body call ({"name": "...", "arguments": ), after which the arguments stream.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


class ToolStreamer:
    """Cuts streamed text into text pieces and tool calls. Text that may be the
    start of a call tag is held back until it is decided. In a JSON-body format
    a call streams: `CallStart` once its name is known, `CallArgs` as its
    arguments are written, then the `ToolCall` itself (same id) when its tag
    closes; other formats give the `ToolCall` whole at its closing tag."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self._held = ""
        self._inside = False
        self._open: Optional[CallStart] = None
        self._sent = 0  # characters of the open call's arguments already streamed
        self._streams = getattr(plan.parser, "__module__", "") in JSON_BODY_PARSERS

    def feed(self, text: str) -> list:
        plan, out = self.plan, []
        held = self._held + text
        while held:
            if self._inside:
                at = held.find(plan.end)
                if at < 0:
                    out += self._progress(held)
                    break
                out.extend(self._call(held[:at]))
                held, self._inside = held[at + len(plan.end):], False
                continue
            at = held.find(plan.start)
            if at >= 0:
                if held[:at]:
                    out.append(held[:at])
                held, self._inside = held[at + len(plan.start):], True
                continue
            keep = partial_suffix(held, plan.start)
            if held[: len(held) - keep]:
                out.append(held[: len(held) - keep])
            held = held[len(held) - keep:]
            break
        self._held = held
        return out

    def flush(self, cut: bool = False) -> list:
        """The end of the answer: an unclosed call is parsed if it can be; one cut before its
        arguments is dropped, as is the start of a call tag that ends an answer cut by max_tokens
        (`cut`); the stream sent neither, since both were held back."""
        held, self._held = self._held, ""
        if not held and not self._open:
            return []
        if self._inside:  # a partial closing tag is not the arguments
            return self._call(held[: len(held) - partial_suffix(held, self.plan.end)], closed=False)
        return [] if cut else [held]

    def _progress(self, body: str) -> list:
        """What an open call's body so far lets stream: its head, then its arguments, less
        what may still be the outer brace or the start of the closing tag."""
        if not self._streams:
            return []
        out = []
        head = _HEAD.match(body)
        if self._open is None:
            if head is None:
                return []
            self._open = CallStart(f"call_{uuid.uuid4().hex[:24]}", json.loads(f'"{head.group(1)}"'))
            self._sent = 0
            out.append(self._open)
        args = body[head.end():]
        args = args[: len(args) - partial_suffix(args, self.plan.end)]
        safe = len(args.rstrip().rstrip("}").rstrip()) if args.rstrip().endswith("}") else len(args)
        if safe > self._sent:
            out.append(CallArgs(self._open.id, args[self._sent:safe]))
            self._sent = safe
        return out

    def _call(self, body: str, closed: bool = True) -> list:
        """The calls mlx-lm's parser reads in one tagged body (the open one ends here);
        a body it cannot read stays text."""
        opened, self._open = self._open, None
        try:
            parsed = self.plan.parser(body, list(self.plan.tools))
        except Exception:  # the model wrote a malformed call
            parsed = None
        calls = [c for c in (parsed if isinstance(parsed, list) else [parsed]) if isinstance(c, dict) and c.get("name")]
        raw = _raw_arguments(body) if self._streams else None
        if opened is not None:  # its head went out: finish it, whatever the parser says
            cut = not closed and raw is None and not calls
            if cut:  # the answer ended inside it: its arguments as far as they were written
                arguments = body[_HEAD.match(body).end():]
            else:
                arguments = raw if raw is not None else (_arguments_text(calls[0].get("arguments")) if calls else "")
            rest = [CallArgs(opened.id, arguments[self._sent:])] if arguments[self._sent:] else []
            return rest + [ToolCall(opened.id, opened.name, arguments, complete=not cut)]
        if not calls:  # a malformed call stays text; an unfinished one (cut in its head) is dropped
            return [self.plan.start + body + self.plan.end] if closed else []
        return [ToolCall(f"call_{uuid.uuid4().hex[:24]}", str(c["name"]),
                         raw if raw is not None and len(calls) == 1 else _arguments_text(c.get("arguments")))
                for c in calls]


def _raw_arguments(body: str) -> Optional[str]:
    """The arguments exactly as a JSON-body call wrote them, when they are one JSON object."""
    head = _HEAD.match(body)
    if head is None:
        return None
    args = body[head.end():].rstrip()
    if not args.endswith("}"):
        return None
    args = args[:-1].rstrip()  # the call object's own closing brace
    try:
        return args if isinstance(json.loads(args), dict) else None
    except json.JSONDecodeError:
        return None


def _arguments_text(arguments) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
