"""The OpenAI Responses API: POST /v1/responses, GET /v1/responses/{id}.

What Codex-style agents call. A body (string or item input, `instructions`,
function tools, `function_call` / `function_call_output` items, `tool_choice`,
`text.format`) becomes chat messages and the same `GenerationRequest` the
chat layer makes; the answer is a response object with `message` and
`function_call` output items, or its event stream (`response.created` …
`response.completed`). `previous_response_id` continues a stored response:
the store keeps the conversation of the last `STORE_SIZE` responses in memory
(`store: false` keeps nothing); an id it does not hold is the protocol's 404.
"""

import json
import time
import uuid
from collections import OrderedDict
from typing import AsyncIterator, Optional

from .errors import ApiError
from .fields import get
from .jobs import Delta, Failed, Finished, GenerationRequest, Job
from .logprobs import logprob_entries
from .openai import read_message, read_tool_call
from .render import ReasoningSplitter, starts_thinking, think_tags
from .fields import check_range
from .sampling_fields import check_model, check_prompt_length, read_logits, read_max_tokens, read_sampling
from .settings import ServeSettings
from .structured import read_response_format
from .tool_prompt import render_with_tools
from .responses_tools import read_tool_choice, read_tools
from .tools import CallArgs, CallStart, ToolCall, ToolPlan, ToolStreamer, plan_tools
from .usage import batch_usage, cache_usage, speculative_usage

STORE_SIZE = 256  # responses kept for previous_response_id and GET


class ResponseStore:
    """The last `size` stored responses: their object and the conversation after them."""

    def __init__(self, size: int = STORE_SIZE):
        self.size = size
        self._items: "OrderedDict[str, tuple[dict, list]]" = OrderedDict()

    def put(self, response: dict, messages: list) -> None:
        self._items[response["id"]] = (response, messages)
        self._items.move_to_end(response["id"])
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str = "previous_response_id") -> tuple[dict, list]:
        if response_id not in self._items:
            raise ApiError(404, f"response '{response_id}' not found: it was never stored here (store: false), "
                                f"or it is older than the last {self.size}", param)
        self._items.move_to_end(response_id)
        return self._items[response_id]


class Call:
    """A parsed Responses request and the conversation it continues."""

    def __init__(self, body: dict, request: GenerationRequest, messages: list, plan: ToolPlan, think: tuple,
                 namespaced: Optional[dict] = None):
        self.body, self.request, self.messages, self.plan, self.think = body, request, messages, plan, think
        self.namespaced = namespaced or {}  # "ns.fn" -> ("ns", "fn"): how a call's name comes back
        self.stream = get(body, "stream", bool, False)
        self.store = get(body, "store", bool, True)


def parse(body: dict, tokenizer, settings: ServeSettings, store: ResponseStore) -> Call:
    check_model(body, settings)
    messages = []
    previous = get(body, "previous_response_id", str)
    if previous is not None:
        messages = list(store.get(previous)[1])
    instructions = get(body, "instructions", str)
    if instructions:  # instructions of an earlier response do not carry over (as OpenAI's API)
        messages = [m for m in messages if m["role"] != "system"]
        messages.insert(0, {"role": "system", "content": instructions})
    messages += _items(body.get("input"))
    if not any(m["role"] != "system" for m in messages):
        raise ApiError(400, "'input' is empty: send a string or at least one input item", "input")
    tools, namespaced = read_tools(body)
    plan = plan_tools(tokenizer, tools, read_tool_choice(body, namespaced), get(body, "parallel_tool_calls", bool, True))
    ids, text = render_with_tools(tokenizer, messages, plan.tools, settings.template_kwargs)
    check_prompt_length(ids, settings.max_prompt_tokens or len(ids), "input")
    # A forced call is the call; with auto, the model's calls or the format's JSON (plan.turn_grammar).
    grammar = plan.turn_grammar(read_response_format(get(body, "text", dict, {}), "format"), "text.format")
    top = get(body, "top_logprobs", int)
    check_range("top_logprobs", top, 0, 20)
    request = GenerationRequest(tuple(ids), read_max_tokens(body, ("max_output_tokens",), settings.default_max_tokens),
                                read_sampling(body, max_temperature=2.0), (), grammar,
                                read_logits(body), top)
    start, end = think_tags(tokenizer)
    return Call(body, request, messages, plan, (start, end, starts_thinking(text, start, end)), namespaced)


# Items of hosted tools' calls a client may carry over from another server's history.
HOSTED_CALL_ITEMS = ("web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
                     "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
                     "tool_search_call", "tool_search_output", "compaction")


def _items(value) -> list[dict]:
    """Input (a string or items) as chat messages; consecutive function calls join one assistant turn."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise ApiError(400, "'input' must be a string or an array of input items", "input")
    out: list[dict] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):  # input_text / output_text parts are text parts
                content = [{**p, "type": "text"} if isinstance(p, dict) and p.get("type") in
                           ("input_text", "output_text") else p for p in content]
            out.append(read_message({**item, "content": content}, i))
        elif kind == "function_call":
            name = get(item, "name", str, required=True)
            namespace = get(item, "namespace", str)
            call = read_tool_call({"id": get(item, "call_id", str, required=True), "type": "function",
                               "function": {"name": f"{namespace}.{name}" if namespace else name,
                                            "arguments": get(item, "arguments", str, "")}}, where)
            if out and out[-1]["role"] == "assistant" and not out[-1]["content"]:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": get(item, "call_id", str, required=True),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # earlier reasoning is not read again
        elif kind in HOSTED_CALL_ITEMS:
            continue  # a hosted tool's call and result: this server never wrote one, the model cannot read it
        else:
            raise ApiError(400, f"'{where}' is an item this server does not read (message, function_call, "
                                f"function_call_output)", where)
    return out


# -- answers ---------------------------------------------------------------------------


class Answer:
    """The response object of one call, built whole or event by event."""

    def __init__(self, call: Call, model_id: str, tokenizer=None):
        # The name the request asked for, as OpenAI's API echoes it.
        self.call, self.model, self.tokenizer = call, get(call.body, "model", str) or model_id, tokenizer
        self.id = f"resp_{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.splitter = ReasoningSplitter(*call.think)
        self.sequence = 0

    def _object(self, status: str, output: list, fin: Optional[Finished]) -> dict:
        body = self.call.body
        incomplete = fin is not None and fin.finish_reason == "length"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": "incomplete" if incomplete else status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.get("instructions"), "max_output_tokens": self.call.request.max_tokens,
            "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"), "store": self.call.store,
            "temperature": self.call.request.sampling.temperature, "top_p": self.call.request.sampling.top_p,
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
            "text": body.get("text", {"format": {"type": "text"}}), "metadata": body.get("metadata") or {},
            "usage": _usage(fin) if fin is not None else None,
        }

    def whole(self, text: str, fin: Finished, store: ResponseStore, deltas: list = ()) -> dict:
        reasoning, content = self.splitter.feed(text)
        r2, c2 = self.splitter.flush()
        content, calls = self.call.plan.split(content + c2, cut=fin.finish_reason == "length")
        output = ([_reasoning_item(reasoning + r2)] if reasoning + r2 else [])
        if content or not calls:
            output.append(_message_item(content))
            if self.call.request.top_logprobs is not None:
                output[-1]["content"][0]["logprobs"] = logprob_entries(self.tokenizer, deltas)
        output += [_call_item(c, self.call.namespaced) for c in calls]
        if fin.finish_reason == "length" and output[-1]["type"] == "message":
            output[-1]["status"] = "incomplete"  # its text was cut (a cut call says so itself)
        response = self._object("completed", output, fin)
        self.keep(response, content, calls, store)
        return response

    def keep(self, response: dict, content: str, calls: list[ToolCall], store: ResponseStore) -> None:
        """Store the response and the conversation after it (unless store: false)."""
        if not self.call.store:
            return
        turn = {"role": "assistant", "content": content}
        if calls:
            turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                                "arguments": c.input}} for c in calls]
        store.put(response, self.call.messages + [turn])

    def event(self, kind: str, data: dict) -> str:
        self.sequence += 1
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    async def stream(self, job: Job, store: ResponseStore) -> AsyncIterator[str]:
        """response.created … response.completed; text streams as output_text deltas, each
        tool call as its own item whose arguments arrive in function_call_arguments deltas."""
        tools = ToolStreamer(self.call.plan) if self.call.plan.parse else None
        output, text_item, content, calls, reasoning = [], None, [], [], []
        yield self.event("response.created", {"response": self._object("in_progress", [], None)})
        yield self.event("response.in_progress", {"response": self._object("in_progress", [], None)})

        def close_text(cut=False):
            nonlocal text_item
            if text_item is None:
                return []
            index, item = text_item
            text = "".join(content)
            item["content"][0]["text"] = text
            if cut:  # still open at the end of a length-cut answer: its text was cut
                item["status"] = "incomplete"
            text_item = None
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            return [self.event("response.output_text.done", {**ids, "text": text, "logprobs": []}),
                    self.event("response.content_part.done", {**ids, "part": item["content"][0]}),
                    self.event("response.output_item.done", {"output_index": index, "item": item})]

        open_items: dict = {}  # call id -> (output index, item) while its arguments stream

        def call_events(piece):
            out = []
            if isinstance(piece, (CallStart, ToolCall)) and piece.id not in open_items:
                out += close_text()
                item, index = _call_item(ToolCall(piece.id, piece.name, ""), self.call.namespaced), len(output)
                output.append(item)
                open_items[piece.id] = (index, item)
                out.append(self.event("response.output_item.added",
                                      {"output_index": index, "item": {**item, "status": "in_progress"}}))
                if isinstance(piece, ToolCall):  # whole: all its arguments at once
                    out += call_events(CallArgs(piece.id, piece.arguments))
            index, item = open_items[piece.id]
            ids = {"item_id": item["id"], "output_index": index}
            if isinstance(piece, CallArgs) and piece.text:
                out.append(self.event("response.function_call_arguments.delta", {**ids, "delta": piece.text}))
            elif isinstance(piece, ToolCall):
                item["arguments"], item["status"] = piece.arguments, _status(piece)
                calls.append(piece)
                out.append(self.event("response.function_call_arguments.done", {**ids, "name": item["name"],
                                                                                 "arguments": piece.arguments}))
                out.append(self.event("response.output_item.done", {"output_index": index, "item": item}))
            return out

        def open_text():
            nonlocal text_item
            item, index = _message_item(""), len(output)
            output.append(item)
            text_item = (index, item)
            return [self.event("response.output_item.added", {"output_index": index, "item": {
                        **item, "status": "in_progress", "content": []}}),
                    self.event("response.content_part.added", {
                        "item_id": item["id"], "output_index": index, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}})]

        def pieces_out(pieces):
            out = []
            for piece in pieces:
                if isinstance(piece, (CallStart, CallArgs, ToolCall)):
                    out += call_events(piece)
                elif piece:
                    if text_item is None:
                        out += open_text()
                    content.append(piece)
                    out.append(self.event("response.output_text.delta", {"item_id": text_item[1]["id"],
                                                                         "output_index": text_item[0],
                                                                         "content_index": 0, "delta": piece,
                                                                         "logprobs": []}))
            return out

        def feed(text, final=False, cut=False):
            r, c = self.splitter.feed(text)
            if final:
                r2, c2 = self.splitter.flush()
                r, c = r + r2, c + c2
            reasoning.append(r)
            pieces = [c] if tools is None else tools.feed(c) + (tools.flush(cut) if final else [])
            return pieces_out(pieces)

        async for ev in job.events():
            if isinstance(ev, Delta):
                for chunk in feed(ev.text):
                    yield chunk
            elif isinstance(ev, Finished):
                cut = ev.finish_reason == "length"
                last = feed("", final=True, cut=cut)
                if not output:  # an empty answer: one empty message, as `whole` has
                    last += open_text()
                for chunk in last + close_text(cut):
                    yield chunk
                thought = "".join(reasoning)
                final = ([_reasoning_item(thought)] if thought else []) + output
                response = self._object("completed", final, ev)
                self.keep(response, "".join(content), calls, store)
                kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
                yield self.event(kind, {"response": response})
            elif isinstance(ev, Failed):
                failed = self._object("failed", output, None)
                failed["error"] = {"code": "server_error" if ev.status >= 500 else "invalid_request",
                                   "message": ev.message}
                yield self.event("response.failed", {"response": failed})


def _message_item(text: str) -> dict:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call: ToolCall, namespaced: dict) -> dict:
    """A function_call item; a namespaced tool's call names its namespace and function apart."""
    namespace, name = namespaced.get(call.name, (None, call.name))
    item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call.id, "name": name,
            "arguments": call.arguments, "status": _status(call)}
    return {**item, "namespace": namespace} if namespace else item


def _status(call: ToolCall) -> str:
    return "completed" if call.complete else "incomplete"


def _reasoning_item(text: str) -> dict:
    return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:24]}", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _usage(fin: Finished) -> dict:
    # cache_write_tokens 0, as Anthropic's cache_creation_input_tokens (the SDK's type requires it).
    return {"input_tokens": fin.prompt_tokens, "input_tokens_details": {"cached_tokens": fin.cached_tokens,
                                                                        "cache_write_tokens": 0},
            "output_tokens": fin.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": fin.prompt_tokens + fin.completion_tokens, "dflash2": speculative_usage(fin.stats),
            "dflash2_prompt_cache": cache_usage(fin.cached_tokens, fin.cached_disk),
            "dflash2_batch": batch_usage(fin)}
