"""The ASGI application: routes, authentication, body limits and error objects.

Both protocol layers call the one `EngineService`. Every failure a client can
cause answers with its protocol's error object (Anthropic's on /v1/messages,
OpenAI's elsewhere) and a status; nothing answers with a traceback, and the
server keeps serving. Every token id and number is checked here, at the door,
before it reaches the engine (sampling_fields.py). Once the engine has died
(service.py) /health and every request answer 503 with the reason.
"""

import asyncio
import hmac
import logging
import time
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import anthropic, openai, responses, web
from .drain import Drain, retry_after_s
from .errors import ApiError, log_failure
from .body import read_json
from .jobs import collect
from .models import model_card, models_list
from ..text.context import context_limit
from .service import EngineFailed, EngineService, QueueFull, ShuttingDown
from .sampling_fields import check_token_ids, check_vocabulary
from .settings import ServeSettings

log = logging.getLogger("dflash2.serve")

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
          "/v1/models",
          "/health", "/metrics", "/", "/v1/dflash/state", "/v1/dflash/race")
OPEN_PATHS = ("/health",)  # answered without a key: load balancers and supervisors poll it


def create_app(service: EngineService, settings: ServeSettings, drain: Drain = None, race=None) -> Starlette:
    """The server for a started `service` (models loaded). `drain`, when
    given, is started by whoever stops the server (drain.py). `race`, when
    given, is what POST /v1/dflash/race runs (web.py)."""
    tokenizer = service.tokenizer
    drain = drain or Drain()
    created = int(time.time())
    store = responses.ResponseStore()
    context = context_limit(getattr(service.pair, "target", None))

    async def health(request: Request) -> Response:
        if service.failure is not None:  # a supervisor restarts it (cli/serve.py exits)
            return JSONResponse({"status": "failed", "model": settings.model_id, "reason": service.failure},
                                status_code=503)
        if drain.draining:  # a load balancer takes this instance out
            return JSONResponse({"status": "draining", "model": settings.model_id,
                                 "queue_length": service.queue_length}, status_code=503)
        return JSONResponse({"status": "ok", "model": settings.model_id, "queue_length": service.queue_length})

    async def metrics(request: Request) -> Response:
        pool = service.pool
        text = service.metrics.render(service.queue_length, service.busy, len(pool), pool.nbytes, drain.held,
                                      tiers=pool.stats())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def models(request: Request) -> Response:
        return JSONResponse(models_list(settings.served_names, created, context))

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in settings.served_names:
            names = ", ".join(f"'{n}'" for n in settings.served_names)
            raise ApiError(404, f"model '{name}' is not listed here: the served names are {names}", "model")
        return JSONResponse(model_card(name, created, context))

    async def chat_completions(request: Request) -> Response:
        return await _openai(request, openai.parse_chat)

    async def completions(request: Request) -> Response:
        return await _openai(request, openai.parse_completion)

    async def _openai(request: Request, parse) -> Response:
        call = parse(await read_json(request, settings.max_body_bytes), tokenizer, settings)
        job = submit(service, call.request, "messages" if call.chat else "prompt")
        answer = openai.Answer(call, settings.model_id, tokenizer)
        if call.stream:
            return StreamingResponse(openai.stream(job, answer), media_type="text/event-stream")
        text, deltas, fin = await collect(job, request.is_disconnected)
        if fin is None:  # the client left; nobody reads this
            return Response(status_code=499)
        return JSONResponse(answer.whole(text, fin, deltas))

    async def messages(request: Request) -> Response:
        call = anthropic.parse_messages(await read_json(request, settings.max_body_bytes), tokenizer, settings)
        job = submit(service, call.request, "messages")
        answer = anthropic.Answer(call, settings.model_id, tokenizer)
        if call.stream:
            return StreamingResponse(answer.stream(job), media_type="text/event-stream")
        text, deltas, fin = await collect(job, request.is_disconnected)
        if fin is None:
            return Response(status_code=499)
        return JSONResponse(answer.whole(text, [d.token for d in deltas], fin))

    async def create_response(request: Request) -> Response:
        call = responses.parse(await read_json(request, settings.max_body_bytes), tokenizer, settings, store)
        job = submit(service, call.request, "input")
        answer = responses.Answer(call, settings.model_id, tokenizer)
        if call.stream:
            return StreamingResponse(answer.stream(job, store), media_type="text/event-stream")
        text, deltas, fin = await collect(job, request.is_disconnected)
        if fin is None:
            return Response(status_code=499)
        return JSONResponse(answer.whole(text, fin, store, deltas))

    async def get_response(request: Request) -> Response:
        return JSONResponse(store.get(request.path_params["id"], "response_id")[0])

    async def count_tokens(request: Request) -> Response:
        body = await read_json(request, settings.max_body_bytes)
        return JSONResponse(anthropic.count_tokens(body, tokenizer, settings))

    @asynccontextmanager
    async def lifespan(app):
        yield
        # Uvicorn has drained the open requests by now: end the worker.
        await asyncio.to_thread(service.stop)

    app = _App(
        routes=[
            Route("/health", health), Route("/metrics", metrics),
            Route("/v1/models", models), Route("/v1/models/{name:path}", model),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{id}", get_response, methods=["GET"]),
            *web.routes(service, settings, race),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )
    app.add_middleware(_Guard, settings=settings, metrics=service.metrics, drain=drain)
    app.state.drain = drain
    return app


class _App(Starlette):
    """Starlette, less the traceback it raises again after a 500 has gone out (the
    handler logged the bug in one line, its traceback at DEBUG: serve --debug)."""

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except Exception:
            if scope["type"] != "http":
                raise


def submit(service: EngineService, request, param: str):
    """Queue `request` once its token ids fit the target (`param`: where its prompt came from)."""
    vocab_size = service.pair.target.vocab_size
    check_token_ids(request.prompt_ids, vocab_size, param)
    check_vocabulary(request.logits, vocab_size)
    try:
        return service.submit(request)
    except QueueFull:
        wait = retry_after_s(service.metrics.mean_generation_s)
        raise ApiError(429, f"the server is full ({service.running_limit} running, {service.max_queue} waiting): retry in about {wait} s",
                       headers={"Retry-After": str(wait)}) from None
    except ShuttingDown:
        raise ApiError(503, "the server is shutting down: retry on another instance") from None
    except EngineFailed as e:
        raise ApiError(503, f"the engine stopped ({e}): this server must be restarted; retry on another instance") from None


def _error_response(request_path: str, error: ApiError) -> JSONResponse:
    anthropic_route = request_path.startswith("/v1/messages")
    body = error.anthropic_body() if anthropic_route else error.openai_body()
    return JSONResponse(body, status_code=error.status, headers=error.headers or None)


async def _api_error(request: Request, exc: ApiError) -> Response:
    return _error_response(request.url.path, exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        message = (f"no route {request.method} {request.url.path}: this server answers "
                   + ", ".join(ROUTES))
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return _error_response(request.url.path, ApiError(exc.status_code, message))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return _error_response(request.url.path, ApiError(500, log_failure(log, "request failed", exc)))


_WATCH_PATHS = ("/health", "/metrics")
_DRAINING = "the server is shutting down and takes no new requests: retry on another instance"


class _Guard:
    """Checks the API key (before any body is read, so a bad key never starts
    a generation), answers 503 while the server drains (drain.py), counts
    requests by route and status, and the requests the drain waits for."""

    def __init__(self, app, settings: ServeSettings, metrics, drain: Drain):
        self.app, self.settings, self.metrics, self.drain = app, settings, metrics, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in ROUTES else ("/v1/models/{name}" if path.startswith("/v1/models/") else "other")
        status = {}

        async def counted_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            key = self.settings.api_key
            if key is not None and path not in OPEN_PATHS and not web.is_page_path(path) and not _key_ok(scope, key):
                error = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
                return await _error_response(path, error)(scope, receive, counted_send)
            if path in _WATCH_PATHS:  # answered at once, draining or not; the drain does not wait for them
                return await self.app(scope, receive, counted_send)
            if self.drain.draining:
                return await _draining_response(path)(scope, receive, counted_send)
            self.drain.held += 1
            try:
                await self.app(scope, receive, counted_send)
            finally:
                self.drain.held -= 1
        finally:
            self.metrics.count_request(route, status.get("code", 499))


def _draining_response(path: str) -> Response:
    """503 for a request that arrived after the drain began; the connection closes after it."""
    return _error_response(path, ApiError(503, _DRAINING, headers={"Connection": "close"}))


def _key_ok(scope, key: str) -> bool:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), key.encode())
