"""What a protocol layer hands the engine service, and what it gets back.

The protocol layers (OpenAI, Anthropic) turn a request body into one
`GenerationRequest` of token ids and settings; the service answers with a
stream of events: `Started`, then `Delta`s, then one `Finished`. A `Task` is
other work for the worker (the race), answered with its return value.
"""

import asyncio
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Optional, Union

from ..engine.decode.rows import TokenLogprobs
from ..engine.grammar import Grammar
from ..engine.request import DecodeRequest
from ..engine.sampling import SamplingParams
from ..text.stats import GenerationStats
from .errors import ApiError


@dataclass(frozen=True)
class GenerationRequest:
    """A request as it travels (to the worker, and as JSON to other ranks): token ids
    and plain data. `decode_request` makes it the engine's `DecodeRequest`."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    grammar: Optional[Grammar] = None  # structured output (response_format, a forced tool call)
    # mlx-lm's make_logits_processors keywords as (name, value) pairs (logit_bias as pairs too),
    # so the request stays plain data that can be sent to other ranks.
    logits: tuple = ()
    top_logprobs: Optional[int] = None  # None: no log-probabilities; k: the token's and the k most likely

    def decode_request(self, server: DecodeRequest) -> DecodeRequest:
        """This request's settings over the server's (`server`: block size, tree, prefill
        step), checked as every request is (a `RequestError` naming the field)."""
        return server.replace(max_tokens=self.max_tokens, sampling=self.sampling, stop=self.stop,
                              grammar=self.grammar, logits_processors=self._logits_processors(),
                              top_logprobs=self.top_logprobs)

    def _logits_processors(self) -> list:
        from mlx_lm.sample_utils import make_logits_processors

        kwargs = dict(self.logits)
        if "logit_bias" in kwargs:
            kwargs["logit_bias"] = dict(kwargs["logit_bias"])
        return make_logits_processors(**kwargs) if kwargs else []


@dataclass(frozen=True)
class Started:
    """The request left the queue; `cached_tokens` of the prompt come from the prompt cache."""

    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Delta:
    text: str  # may be '' while a character is incomplete
    token: int
    logprobs: Optional[TokenLogprobs] = None
    from_draft: bool = False  # drafted by the drafter and accepted by the target (the page colours it)


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop", "length", or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    eos: bool  # the answer ended with an end-of-sequence token (not a stop string)
    stats: Optional[GenerationStats]  # None when cancelled before the end
    cached_disk: int = 0  # of cached_tokens, read from the disk tier
    batch: int = 1  # the most requests it shared a target pass with, itself included
    max_batch: int = 1  # the server's --max-batch
    batch_note: Optional[str] = None  # why it ran alone on a server asked to batch


@dataclass(frozen=True)
class Failed:
    """The engine raised; `message` is one line for the client (no traceback)."""

    message: str
    status: int = 500


Event = Union[Started, Delta, Finished, Failed]


class Job:
    """One queued request. The service's worker thread posts events into the
    asyncio loop the request came from; the request side reads them and may
    cancel (a client that went away)."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def post(self, event: Event) -> None:
        """Called from the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()

    async def events(self, gone: Optional[Callable[[], Awaitable[bool]]] = None,
                     poll_s: float = 0.25) -> AsyncIterator[Event]:
        """Events until `Finished` or `Failed`. `gone()`, when given, is asked
        every `poll_s` while nothing arrives; when it says the client left, the
        job is cancelled and the iteration ends."""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(self._events.get(), timeout=poll_s if gone else None)
                except asyncio.TimeoutError:
                    if await gone():
                        self.cancel()
                        return
                    continue
                yield event
                if isinstance(event, (Finished, Failed)):
                    return
        finally:
            # However the reader stops (disconnect, error, cancellation of its
            # task), the worker stops this job at its next token; after the
            # job finished this changes nothing.
            self.cancelled.set()


async def collect(job: Job, gone: Callable[[], Awaitable[bool]]) -> tuple[str, list[Delta], Optional[Finished]]:
    """(text, the Delta of each token, Finished) of a whole answer; Finished is None
    when the client left first. A failure comes back as the `Failed` event's error."""
    deltas = []
    async for event in job.events(gone):
        if isinstance(event, Delta):
            deltas.append(event)
        elif isinstance(event, Finished):
            return "".join(d.text for d in deltas), deltas, event
        elif isinstance(event, Failed):
            raise ApiError(event.status, event.message)
    return "".join(d.text for d in deltas), deltas, None


class Task:
    """Work other than a generation, run on the worker thread (it owns the model):
    `work(service)`, the service being the `EngineService` (service.py)."""

    def __init__(self, work: Callable[[object], object], loop: asyncio.AbstractEventLoop):
        self.work = work
        self._future = loop.create_future()
        self._loop = loop

    def run(self, service) -> None:
        try:
            value, error = self.work(service), None
        except Exception as e:  # handed to the awaiting request, which answers with one line
            value, error = None, e
        try:
            self._loop.call_soon_threadsafe(self._settle, value, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def fail(self, error: Exception) -> None:
        """End the task unrun (the worker died before it)."""
        try:
            self._loop.call_soon_threadsafe(self._settle, None, error)
        except RuntimeError:
            pass

    def _settle(self, value, error) -> None:
        if self._future.done():
            return
        if error is not None:
            self._future.set_exception(error)
        else:
            self._future.set_result(value)

    async def result(self):
        return await asyncio.shield(self._future)


def fail_all(jobs: list, line: str, error: Exception) -> None:
    """The worker died (`line` says why): every job and task in `jobs` ends, none hangs."""
    failed = Failed(f"the engine stopped ({line}): this server must be restarted", 503)
    for job in jobs:
        if isinstance(job, Job):
            job.post(failed)
        elif isinstance(job, Task):
            job.fail(error)
