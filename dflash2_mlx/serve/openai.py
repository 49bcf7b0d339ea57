"""The OpenAI protocol: /v1/chat/completions, /v1/completions (/v1/models: models.py).

Thin: it reads a body into a `GenerationRequest`, and turns the service's
events into the OpenAI JSON or server-sent-event chunks. Nothing here touches
the model.
"""

import json
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from ..text.generate import encode_prompt
from .errors import ApiError
from .fields import get, stop_list
from .jobs import Delta, Failed, Finished, GenerationRequest, Job, Started
from .logprobs import logprob_entries
from .render import ReasoningSplitter, partial_suffix, starts_thinking, think_tags
from .fields import check_range
from .sampling_fields import check_model, check_prompt_length, read_logits, read_max_tokens, read_sampling
from .settings import ServeSettings
from .structured import read_response_format
from .tool_prompt import render_with_tools
from .tools import CallArgs, ToolCall, ToolPlan, ToolStreamer, plan_tools
from .usage import batch_usage, cache_usage, speculative_usage


@dataclass(frozen=True)
class Call:
    """A parsed request and how to answer it."""

    request: GenerationRequest
    chat: bool
    stream: bool
    include_usage: bool
    think: tuple  # (start tag, end tag, answer starts inside the think block)
    tools: ToolPlan = ToolPlan()
    model: Optional[str] = None  # the name the request asked for: answers echo it (as OpenAI's API)


def parse_chat(body: dict, tokenizer, settings: ServeSettings) -> Call:
    messages = [read_message(m, i) for i, m in enumerate(get(body, "messages", list, required=True))]
    if not messages:
        raise ApiError(400, "'messages' is empty: send at least one message", "messages")
    plan = plan_tools(tokenizer, read_tools(body), read_tool_choice(body),
                      get(body, "parallel_tool_calls", bool, True))
    kwargs = {**settings.template_kwargs, **get(body, "chat_template_kwargs", dict, {})}
    ids, text = render_with_tools(tokenizer, messages, plan.tools, kwargs)
    start, end = think_tags(tokenizer)
    return _call(body, ids, settings, chat=True, think=(start, end, starts_thinking(text, start, end)), tools=plan)


def parse_completion(body: dict, tokenizer, settings: ServeSettings) -> Call:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, str):
        ids = encode_prompt(tokenizer, prompt) if prompt else []
    elif prompt is None:
        raise ApiError(400, "'prompt' is required", "prompt")
    else:
        raise ApiError(400, "'prompt' must be a string or an array of token ids (one prompt per request)", "prompt")
    asked = {"echo": bool(body.get("echo")), "suffix": bool(body.get("suffix")),
             "best_of": body.get("best_of") not in (None, 1)}
    for name, used in asked.items():
        if used:
            raise ApiError(422, f"'{name}' is not supported by this server", name)
    return _call(body, ids, settings, chat=False, think=(None, None, False))


def _call(body: dict, ids: list, settings: ServeSettings, chat: bool, think: tuple,
          tools: ToolPlan = ToolPlan()) -> Call:
    check_model(body, settings)
    n = get(body, "n", int, 1)
    if n != 1:
        raise ApiError(422, f"'n' {n} is not supported: this server returns one choice (n = 1); "
                            "send n requests", "n")
    logits = read_logits(body)
    top = read_top_logprobs(body, chat)
    stream = get(body, "stream", bool, False)
    options = get(body, "stream_options", dict, {}) or {}
    include_usage = bool(get(options, "include_usage", bool, False))
    sampling = read_sampling(body, max_temperature=2.0)
    max_tokens = read_max_tokens(body, ("max_completion_tokens", "max_tokens"), settings.default_max_tokens)
    # No --max-prompt-tokens: only the model's context bounds it (EngineService.submit).
    check_prompt_length(ids, settings.max_prompt_tokens or len(ids), "messages" if chat else "prompt")
    stop = stop_list(body, "stop", limit=4)
    # A forced call is the call; with auto, the model's calls or the format's JSON (tools.turn_grammar).
    grammar = tools.turn_grammar(read_response_format(body), "response_format")
    request = GenerationRequest(tuple(ids), max_tokens, sampling, stop, grammar, logits, top)
    return Call(request, chat, stream, include_usage, think, tools, get(body, "model", str))


def read_message(m, index: int) -> dict:
    """One chat message as the template reads it (text content only)."""
    where = f"messages[{index}]"
    if not isinstance(m, dict):
        raise ApiError(400, f"'{where}' must be an object with 'role' and 'content'", where)
    role = get(m, "role", str, required=True)
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise ApiError(400, f"'{where}.role' '{role}' is not one of system, developer, user, assistant, tool",
                       f"{where}.role")
    out = {"role": "system" if role == "developer" else role, "content": _text(m.get("content"), where)}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [read_tool_call(c, where) for c in get(m, "tool_calls", list)]
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def read_top_logprobs(body: dict, chat: bool):
    """None, or how many most likely tokens to report beside each token's log-probability:
    chat's `logprobs: true` with `top_logprobs` 0..20, completions' `logprobs` 0..5."""
    if chat:
        top = get(body, "top_logprobs", int)
        if not get(body, "logprobs", bool, False):
            if top:
                raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
            return None
        check_range("top_logprobs", top, 0, 20)
        return top or 0
    top = get(body, "logprobs", int)
    check_range("logprobs", top, 0, 5)
    return top


def read_tools(body: dict) -> list:
    """OpenAI function tools, checked to carry a name."""
    tools = get(body, "tools", list, []) or []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or tool.get("type", "function") != "function":
            raise ApiError(400, f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                           f"tools[{i}]")
    return tools


def read_tool_choice(body: dict):
    """None, "none", "auto", "required", or the name of the function a call must use."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) and isinstance(choice["function"].get("name"), str):
        return choice["function"]["name"]
    raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")


def _text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"'{where}.content' may only hold text parts (this server reads text)",
                               f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"'{where}.content' must be a string or an array of text parts", f"{where}.content")


def read_tool_call(call, where: str) -> dict:
    # Templates expect the arguments as an object; the protocol sends a JSON string.
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ApiError(400, f"'{where}.tool_calls' entries need a 'function' object", f"{where}.tool_calls")
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"] else {}
        except json.JSONDecodeError:
            pass  # left as text: some templates print it as is
    return {**call, "function": fn}


# -- answers ---------------------------------------------------------------------------


def usage(fin: Finished) -> dict:
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
        "dflash2": speculative_usage(fin.stats),
        "dflash2_prompt_cache": cache_usage(fin.cached_tokens, fin.cached_disk),
        "dflash2_batch": batch_usage(fin),
    }


class Answer:
    """Builds the response objects for one call."""

    def __init__(self, call: Call, model_id: str, tokenizer=None):
        self.call, self.model, self.tokenizer = call, call.model or model_id, tokenizer
        self.unsent: list = []  # streamed Deltas whose log-probabilities have not gone out yet
        self.text = ""  # every streamed Delta's text so far (where the call markup sits)
        self.unsent_at = 0  # where in `text` the first unsent Delta's text begins
        # A forced call's stream opens with the call: the role goes out on its first chunk with
        # content null, as OpenAI streams a tool call (a text answer's role goes out at once).
        self.role_pending = call.chat and call.tools.grammar is not None
        prefix = "chatcmpl" if call.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.splitter = ReasoningSplitter(*call.think)
        self.tool_stream = ToolStreamer(call.tools) if call.tools.parse else None
        self._indices: dict = {}  # streamed tool call id -> its index in the stream
        # Whether the token being streamed came from the drafter: sent as an extra `dflash`
        # object on each chunk its text goes out in (OpenAI clients ignore unknown fields; the
        # page colours drafted text). Text a splitter held back rides on the token that frees it.
        self.from_draft: Optional[bool] = None

    def _envelope(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.call.chat else "text_completion") + (".chunk" if chunk and self.call.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def add(self, delta: Delta) -> None:
        """A streamed token: its text, and its log-probabilities to send."""
        if delta.logprobs is not None:
            if not self.unsent:
                self.unsent_at = len(self.text)
            self.unsent.append(delta)
        self.text += delta.text

    def logprobs(self, deltas: list, text: Optional[str] = None, at: int = 0) -> Optional[dict]:
        """The `logprobs` object of these tokens, in the chat or the completions shape (`text`:
        all the answer's text, where `deltas` begin at `at`; default: theirs alone)."""
        if self.call.request.top_logprobs is None:
            return None
        if self.call.chat:
            text = "".join(d.text for d in deltas) if text is None else text
            return {"content": logprob_entries(self.tokenizer, self.answer_tokens(deltas, text, at))}
        entries = [(d.token, d.logprobs) for d in deltas if d.logprobs is not None]
        name = lambda t: self.tokenizer.decode([t])  # noqa: E731
        offsets, at = [], 0
        for t, _ in entries:
            offsets.append(at)
            at += len(name(t))
        return {"tokens": [name(t) for t, _ in entries], "token_logprobs": [lp.logprob for _, lp in entries],
                "top_logprobs": [{name(i): v for i, v in lp.top} for _, lp in entries], "text_offset": offsets}

    def whole(self, text: str, fin: Finished, deltas: list = ()) -> dict:
        if self.call.chat:
            reasoning, content = self.splitter.feed(text)
            r2, c2 = self.splitter.flush()
            content, calls = self.call.tools.split(content + c2, cut=fin.finish_reason == "length")
            message = {"role": "assistant", "content": content if content or not calls else None}
            if reasoning + r2:
                message["reasoning_content"] = reasoning + r2
            finish = fin.finish_reason
            if calls:
                message["tool_calls"] = [_tool_call_json(c) for c in calls]
                finish = "tool_calls" if finish == "stop" else finish
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": self.logprobs(deltas)}
        else:
            choice = {"index": 0, "text": text, "finish_reason": fin.finish_reason, "logprobs": self.logprobs(deltas)}
        return {**self._envelope(False), "choices": [choice], "usage": usage(fin)}

    def answer_tokens(self, deltas: list, text: str, at: int = 0) -> list:
        """`deltas` less what is not the answer's own text: end-of-sequence tokens and, with
        tools parsed, the tokens of the call tags (`text`: the answer's text, `deltas`' from `at`)."""
        eos = set(getattr(self.tokenizer, "eos_token_ids", None) or [])
        plan = self.call.tools
        tags = [t for t in (plan.start, plan.end) if t] if plan.parse else []
        spans = [(p, p + len(tag)) for tag in tags for p in _finds(text, tag)]
        out = []
        for d in deltas:
            a, at = at, at + len(d.text)
            if d.token in eos or (a < at and any(s <= a and at <= e for s, e in spans)):
                continue
            out.append(d)
        return out

    def _ready_logprobs(self, final: bool) -> list:
        """The unsent Deltas that may go out now: all of them but those that may still turn
        out to be part of a call tag (held until it is decided)."""
        plan = self.call.tools
        if final or not (self.call.chat and plan.parse and plan.start):
            ready, self.unsent = self.unsent, []
            return ready
        hold = max(partial_suffix(self.text, t) for t in (plan.start, plan.end) if t)
        n, tail = len(self.unsent), 0
        while n and tail < hold:
            n, tail = n - 1, tail + len(self.unsent[n - 1].text)
        ready, self.unsent = self.unsent[:n], self.unsent[n:]
        return ready

    def chunk(self, delta: Optional[dict] = None, text: str = "", finish: Optional[str] = None) -> str:
        # Log-probabilities of the tokens streamed so far ride on the next chunk that goes out.
        at = self.unsent_at
        ready = self._ready_logprobs(finish is not None) if self.unsent else []
        self.unsent_at += sum(len(d.text) for d in ready)
        logprobs = self.logprobs(ready, self.text, at) if ready else None
        if logprobs is not None and self.call.chat and not logprobs["content"]:
            logprobs = None  # only call markup: as a chunk with no tokens
        if self.call.chat:
            delta = delta or {}
            if self.role_pending:
                self.role_pending = False
                delta = {"role": "assistant", "content": None if "tool_calls" in delta else "", **delta}
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
        body = {**self._envelope(True), "choices": [choice]}
        if self.call.include_usage:  # OpenAI's chunks carry usage null until the last (usage) chunk
            body["usage"] = None
        if self.from_draft is not None:
            body["dflash"] = {"from_draft": self.from_draft}
        return sse(body)

    def text_chunks(self, text: str, final: bool = False, cut: bool = False) -> list[str]:
        if not self.call.chat:
            return [self.chunk(text=text)] if text else []
        reasoning, content = self.splitter.feed(text)
        if final:
            r2, c2 = self.splitter.flush()
            reasoning, content = reasoning + r2, content + c2
        out = []
        if reasoning:
            out.append(self.chunk({"reasoning_content": reasoning}))
        pieces = [content] if self.tool_stream is None else self.tool_stream.feed(content)
        if final and self.tool_stream is not None:
            pieces += self.tool_stream.flush(cut)
        for piece in pieces:
            if isinstance(piece, str):
                if piece:
                    out.append(self.chunk({"content": piece}))
            elif isinstance(piece, CallArgs):
                out.append(self._arguments_chunk(piece.id, piece.text))
            elif piece.id not in self._indices:  # a CallStart, or a ToolCall that came whole
                out.append(self._call_head(piece))
                if isinstance(piece, ToolCall):
                    out.append(self._arguments_chunk(piece.id, piece.arguments))
            # else: the ToolCall closing a call whose arguments already streamed
        return out

    def _call_head(self, call) -> str:
        """A tool call's first chunk, as OpenAI streams one: index, id and name."""
        index = self._indices[call.id] = len(self._indices)
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        # The first call's chunk says content null, as OpenAI's does.
        return self.chunk({"content": None, "tool_calls": [head]} if index == 0 else {"tool_calls": [head]})

    def _arguments_chunk(self, call_id: str, text: str) -> str:
        return self.chunk({"tool_calls": [{"index": self._indices[call_id], "function": {"arguments": text}}]})

    def finish_reason(self, fin: Finished) -> str:
        return "tool_calls" if self._indices and fin.finish_reason == "stop" else fin.finish_reason


async def stream(job: Job, answer: Answer) -> AsyncIterator[str]:
    """Server-sent events for one call; a disconnect cancels the task, and with
    it the job (see `Job.events`)."""
    async for event in job.events():
        if isinstance(event, Started) and answer.call.chat and not answer.role_pending:
            yield answer.chunk({"role": "assistant", "content": ""})
        elif isinstance(event, Delta):
            answer.add(event)
            answer.from_draft = event.from_draft
            for chunk in answer.text_chunks(event.text):
                yield chunk
            answer.from_draft = None
        elif isinstance(event, Finished):
            for chunk in answer.text_chunks("", final=True, cut=event.finish_reason == "length"):
                yield chunk
            yield answer.chunk({}, finish=answer.finish_reason(event))
            if answer.call.include_usage:
                yield sse({**answer._envelope(True), "choices": [], "usage": usage(event)})
        elif isinstance(event, Failed):
            yield sse(ApiError(event.status, event.message).openai_body())
    yield "data: [DONE]\n\n"


def _finds(text: str, tag: str):
    at = text.find(tag)
    while at >= 0:
        yield at
        at = text.find(tag, at + len(tag))


def _tool_call_json(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
