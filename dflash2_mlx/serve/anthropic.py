"""The Anthropic protocol: POST /v1/messages (streaming and not).

Thin, like the OpenAI layer: a body becomes a `GenerationRequest`; the
service's events become a message or the `message_start` … `message_stop`
event stream. Thinking (text inside the template's think tags) becomes
`thinking` blocks, the rest `text` blocks.
"""

import json
import logging
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from .errors import ApiError
from .fields import get, stop_list
from .jobs import Delta, Failed, Finished, GenerationRequest, Job, Started
from .render import ReasoningSplitter, starts_thinking, think_tags
from .sampling_fields import check_model, check_prompt_length, read_max_tokens, read_sampling
from .settings import ServeSettings
from .structured import read_output_config
from .tool_prompt import render_with_tools
from .tools import CallArgs, CallStart, ToolCall, ToolPlan, ToolStreamer, plan_tools
from .usage import batch_usage, cache_usage, speculative_usage


log = logging.getLogger("dflash2.serve")
_noted: set = set()  # tool types already named in the log


@dataclass(frozen=True)
class Call:
    request: GenerationRequest
    stream: bool
    think: tuple  # (start tag, end tag, answer starts inside the think block)
    tools: ToolPlan = ToolPlan()
    model: Optional[str] = None  # the name the request asked for: answers echo it


def parse_messages(body: dict, tokenizer, settings: ServeSettings) -> Call:
    plan = _tool_plan(body, tokenizer)
    ids, text = conversation(body, tokenizer, settings, plan)
    # No --max-prompt-tokens: only the model's context bounds it (EngineService.submit).
    check_prompt_length(ids, settings.max_prompt_tokens or len(ids), "messages")
    sampling = read_sampling(body, max_temperature=1.0)
    max_tokens = read_max_tokens(body, ("max_tokens",), 0, required=True)
    # A forced call is the call; with auto, the model's calls or the format's JSON (plan.turn_grammar).
    grammar = plan.turn_grammar(read_output_config(body), "output_config.format")
    request = GenerationRequest(tuple(ids), max_tokens, sampling, stop_list(body, "stop_sequences"), grammar)
    start, end = think_tags(tokenizer)
    return Call(request, get(body, "stream", bool, False), (start, end, starts_thinking(text, start, end)), plan,
                get(body, "model", str))


def _tool_plan(body: dict, tokenizer) -> ToolPlan:
    """Anthropic's tools and tool_choice (auto / any / tool / none) as a `ToolPlan`: the tools
    offered at the end of the conversation (system messages may add or withdraw some)."""
    declared = [_tool(t, i) for i, t in enumerate(get(body, "tools", list, []) or [])]
    tools = _offered([t for t in declared if t is not None], get(body, "messages", list, []) or [])
    choice = get(body, "tool_choice", dict, {"type": "auto"})
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise ApiError(400, "'tool_choice.type' must be auto, any, tool or none", "tool_choice")
    if kind == "tool" and not isinstance(choice.get("name"), str):
        raise ApiError(400, "'tool_choice' of type 'tool' needs the tool's 'name'", "tool_choice")
    named = {"auto": "auto", "any": "required", "none": "none"}.get(kind, choice.get("name"))
    several = not choice.get("disable_parallel_tool_use", False)
    return plan_tools(tokenizer, tools, named, several, schema_field="input_schema")


def count_tokens(body: dict, tokenizer, settings: ServeSettings) -> dict:
    """POST /v1/messages/count_tokens: the prompt tokens a messages call with this body reads."""
    ids, _ = conversation(body, tokenizer, settings, _tool_plan(body, tokenizer))
    return {"input_tokens": len(ids)}


def conversation(body: dict, tokenizer, settings: ServeSettings, plan: ToolPlan) -> tuple[list[int], str]:
    """The prompt ids (and text) of a messages body: system, messages and tools, rendered."""
    check_model(body, settings)
    messages = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    raw = get(body, "messages", list, required=True)
    if not raw:
        raise ApiError(400, "'messages' is empty: send at least one message", "messages")
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"'{where}' must be an object with 'role' and 'content'", where)
        role = get(m, "role", str, required=True, where=where)
        if role == "system":  # the beta's mid-conversation system message (BetaSystemMessageParam)
            messages += _system_turn(m, where, later_user=any(isinstance(n, dict) and n.get("role") == "user"
                                                               for n in raw[i + 1:]))
            continue
        if role not in ("user", "assistant"):
            raise ApiError(400, f"'{where}.role' must be 'user', 'assistant' or 'system'", f"{where}.role")
        messages += _turn(role, m.get("content"), f"{where}.content")
    kwargs = {**settings.template_kwargs, **_thinking_kwargs(body)}
    return render_with_tools(tokenizer, messages, plan.tools, kwargs)


def _system_turn(message: dict, where: str, later_user: bool) -> list[dict]:
    """A system message inside `messages`: its text, as a system turn where it stands. One that
    asked to be shown only until the next user message is not shown once one follows; its tool
    additions and removals act on the offered tools (`_offered`)."""
    if message.get("clear_at") == "next_user_message" and later_user:
        return []
    content = message.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        text = "".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                       and isinstance(b.get("text"), str))
        for j, b in enumerate(content):
            if not isinstance(b, dict) or b.get("type") not in ("text", "tool_addition", "tool_removal"):
                raise ApiError(400, f"'{where}.content[{j}]' is a block a system message cannot hold (text, "
                                    f"tool_addition, tool_removal)", f"{where}.content[{j}]")
    else:
        raise ApiError(400, f"'{where}.content' must be a string or an array of blocks", f"{where}.content")
    return [{"role": "system", "content": text}] if text else []


def _offered(tools: list, messages: list) -> list:
    """The tools offered to the model's next turn: those declared, then each system message's
    tool_addition (of a declared tool, or an inline definition) and tool_removal in order."""
    declared = {t["function"]["name"]: t for t in tools}
    offered = dict(declared)
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), list)):
            continue
        for j, block in enumerate(m["content"]):
            change = block.get("tool") if isinstance(block, dict) else None
            if not isinstance(change, dict):
                continue
            if block.get("type") == "tool_removal":
                offered.pop(change.get("name"), None)
            elif block.get("type") == "tool_addition":
                definition = change.get("definition")
                if isinstance(definition, dict):
                    tool = _tool(definition, j)
                    if tool is not None:
                        offered[tool["function"]["name"]] = tool
                else:
                    name = change.get("name")
                    if name in declared:
                        offered[name] = declared[name]
    return list(offered.values())


def _thinking_kwargs(body: dict) -> dict:
    """The `thinking` parameter as the template's switch (Qwen 3's enable_thinking)."""
    thinking = get(body, "thinking", dict)
    if thinking is None:
        return {}
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise ApiError(400, "'thinking.type' must be enabled, disabled or adaptive", "thinking")
    return {"enable_thinking": kind != "disabled"}


def _turn(role: str, content, where: str) -> list[dict]:
    """One Anthropic turn as template messages: text, and the assistant's tool_use blocks
    as tool_calls, the user's tool_result blocks as tool messages."""
    if isinstance(content, str) or not isinstance(content, list):
        return [{"role": role, "content": _text(content, where)}]
    text, calls, results = [], [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            calls.append({"id": block.get("id", ""), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input") or {}}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                            "content": _result_text(block.get("content") or "", f"{where}[{i}].content")})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier thinking is not read again (as Anthropic's API drops it)
        else:
            raise ApiError(400, f"'{where}[{i}]' is a block this server does not read (text, tool_use in "
                                f"assistant turns, tool_result in user turns)", f"{where}[{i}]")
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(text), **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise ApiError(400, f"'{where}' may only hold text blocks (this server reads text)", where)
            parts.append(block["text"])
        return "".join(parts)
    raise ApiError(400, f"'{where}' must be a string or an array of text blocks", where)


def _result_text(content, where: str) -> str:
    """A tool result's content as text: a text-only model is told where an image or a document
    stood (a client's Read of a picture must not end the session)."""
    if not isinstance(content, list):
        return _text(content, where)
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind in ("image", "document", "search_result", "tool_reference"):
            parts.append(f"[{kind}: not shown, this model reads text only]")
        else:
            raise ApiError(400, f"'{where}[{j}]' is a block a tool result cannot hold (text, image, document)",
                           f"{where}[{j}]")
    return "".join(parts)


def _tool(tool, index: int) -> Optional[dict]:
    """A custom tool in the chat shape templates read; None for a tool of a type Anthropic
    defines (web_search_*, code_execution_*, bash_*, text_editor_*, ...: run by Anthropic's
    servers or by a client that knows their schema), left out with a note in the log."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise ApiError(400, f"'tools[{index}]' needs a 'name'", f"tools[{index}]")
    kind = tool.get("type") or "custom"
    if kind != "custom":
        if kind not in _noted:
            _noted.add(kind)
            log.info(f"'{kind}' tools are left out of the prompt: a tool type Anthropic defines, "
                     f"not one this server can run")
        return None
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                             "parameters": tool.get("input_schema", {})}}


# -- answers ---------------------------------------------------------------------------


def stop_reason(fin: Finished, stop_sequence: Optional[str], called: bool = False) -> str:
    if fin.finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage(fin: Finished) -> dict:
    # Anthropic counts cache reads apart from input_tokens.
    return {"input_tokens": fin.prompt_tokens - fin.cached_tokens, "output_tokens": fin.completion_tokens,
            "cache_read_input_tokens": fin.cached_tokens, "cache_creation_input_tokens": 0,
            "dflash2": speculative_usage(fin.stats),
            "dflash2_prompt_cache": cache_usage(fin.cached_tokens, fin.cached_disk),
            "dflash2_batch": batch_usage(fin)}


class Answer:
    def __init__(self, call: Call, model_id: str, tokenizer):
        self.call, self.model, self.tokenizer = call, call.model or model_id, tokenizer
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.splitter = ReasoningSplitter(*call.think)
        self.tokens: list[int] = []
        self.emitted = ""

    def _message(self, content: list, fin: Optional[Finished], usage_: dict) -> dict:
        stop = self._stop(fin) if fin else None
        called = any(b["type"] == "tool_use" for b in content)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason(fin, stop, called) if fin else None, "stop_sequence": stop,
                "usage": usage_}

    def _stop(self, fin: Finished) -> Optional[str]:
        """Which stop sequence ended the answer: the one that follows the
        emitted text in the full decode of the generated tokens."""
        stops = self.call.request.stop
        if fin.finish_reason != "stop" or fin.eos or not stops:
            return None
        full = self.tokenizer.decode(self.tokens)
        return next((s for s in stops if full.startswith(s, len(self.emitted))), stops[0])

    def whole(self, text: str, tokens: list[int], fin: Finished) -> dict:
        self.tokens, self.emitted = tokens, text
        reasoning, content = self.splitter.feed(text)
        r2, c2 = self.splitter.flush()
        blocks = []
        if reasoning + r2:
            blocks.append({"type": "thinking", "thinking": reasoning + r2, "signature": ""})
        content, calls = self.call.tools.split(content + c2, cut=fin.finish_reason == "length")
        if content or not calls:
            blocks.append({"type": "text", "text": content})
        blocks += [_tool_use(c) for c in calls]
        return self._message(blocks, fin, usage(fin))

    async def stream(self, job: Job) -> AsyncIterator[str]:
        index, kind = -1, None  # the open content block
        texted = False  # a text block went out (the whole answer has one unless it is only calls)

        def open_block(new_kind):
            nonlocal index, kind, texted
            texted = texted or new_kind == "text"
            out = []
            if kind is not None:
                out.append(event("content_block_stop", {"index": index}))
            index, kind = index + 1, new_kind
            block = {"type": "thinking", "thinking": "", "signature": ""} if new_kind == "thinking" else {"type": "text", "text": ""}
            out.append(event("content_block_start", {"index": index, "content_block": block}))
            return out

        tool_stream = ToolStreamer(self.call.tools) if self.call.tools.parse else None
        called, open_call = False, None  # the id of the tool_use block being streamed

        def arguments(text):
            return [event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": text}})] if text else []

        def tool_use(piece):
            # A tool_use block: its start (input {}), the arguments as input_json_delta
            # pieces (as they are written in a JSON-body format, else at once), its stop.
            nonlocal index, kind, called, open_call
            if isinstance(piece, CallArgs):
                return arguments(piece.text)
            if piece.id == open_call:  # the ToolCall closing the streamed block
                open_call = None
                return [event("content_block_stop", {"index": index})]
            out = [event("content_block_stop", {"index": index})] if kind is not None else []
            index, kind, called, open_call = index + 1, None, True, piece.id
            start = {"type": "tool_use", "id": _tool_use_id(piece.id), "name": piece.name, "input": {}}
            out.append(event("content_block_start", {"index": index, "content_block": start}))
            if isinstance(piece, ToolCall):  # came whole: all its arguments at once, then its stop
                open_call = None
                out += arguments(piece.arguments) + [event("content_block_stop", {"index": index})]
            return out

        def deltas(reasoning, content, final=False, cut=False):
            out = []
            pieces = [content] if tool_stream is None else tool_stream.feed(content) + (tool_stream.flush(cut) if final else [])
            for new_kind, text in [("thinking", reasoning)] + [("text", p) for p in pieces]:
                if isinstance(text, (CallStart, CallArgs, ToolCall)):
                    out += tool_use(text)
                    continue
                if not text:
                    continue
                if kind != new_kind:
                    out += open_block(new_kind)
                delta = {"type": "thinking_delta", "thinking": text} if new_kind == "thinking" else {"type": "text_delta", "text": text}
                out.append(event("content_block_delta", {"index": index, "delta": delta}))
            return out

        async for ev in job.events():
            if isinstance(ev, Started):
                start_usage = {"input_tokens": ev.prompt_tokens - ev.cached_tokens, "output_tokens": 0,
                               "cache_read_input_tokens": ev.cached_tokens, "cache_creation_input_tokens": 0}
                # Blocks open with their first text (as `whole` has no empty block before a tool_use).
                yield event("message_start", {"message": self._message([], None, start_usage)})
            elif isinstance(ev, Delta):
                self.tokens.append(ev.token)
                self.emitted += ev.text
                for chunk in deltas(*self.splitter.feed(ev.text)):
                    yield chunk
            elif isinstance(ev, Finished):
                for chunk in deltas(*self.splitter.flush(), final=True, cut=ev.finish_reason == "length"):
                    yield chunk
                if not texted and not called:  # an empty answer: one empty text block, as `whole`
                    for chunk in open_block("text"):
                        yield chunk
                if kind is not None:
                    yield event("content_block_stop", {"index": index})
                stop = self._stop(ev)
                yield event("message_delta", {"delta": {"stop_reason": stop_reason(ev, stop, called),
                                                        "stop_sequence": stop},
                                              "usage": {"output_tokens": ev.completion_tokens,
                                                        "dflash2": speculative_usage(ev.stats)}})
                yield event("message_stop", {})
            elif isinstance(ev, Failed):
                yield event("error", {"error": ApiError(ev.status, ev.message).anthropic_body()["error"]})


def _tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": call.input}


def _tool_use_id(call_id: str) -> str:
    return call_id.replace("call_", "toolu_", 1)


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"
