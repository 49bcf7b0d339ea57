"""The page at `/` and the two endpoints only it needs.

The page is static files shipped in the package (serve/static: HTML, CSS and
plain JavaScript, no build step and nothing fetched from elsewhere, so it works
offline). It talks to the server's own endpoints: /v1/chat/completions for the
chat, and here GET /v1/dflash/state (the pair, its decode-cost table, the queue,
the prompt cache) and POST /v1/dflash/race (plain decoding and then the pair on
one prompt, run on the engine's one worker so it never overlaps a generation).
"""

import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..device import backend_name
from ..errors import DFlashError
from ..text.prompt import build_prompt
from .body import read_json
from .errors import ApiError
from .fields import get
from .sampling_fields import check_prompt_length, check_token_ids, read_max_tokens, read_sampling
from .service import EngineFailed, EngineService, QueueFull, ShuttingDown
from .settings import ServeSettings

STATIC = Path(__file__).parent / "static"
PAGE_PATHS = ("/", "/favicon.ico")  # answered without a key: the page asks for it, then sends it
# The browser itself refuses anything but this server: the page works offline and leaks nothing.
CSP = "default-src 'self'; connect-src 'self' blob:; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'self'"
RACE_MAX_TOKENS = 1024  # both arms run in turn while every other request waits: keep a race short


def is_page_path(path: str) -> bool:
    return path in PAGE_PATHS or path.startswith("/static/")


def routes(service: EngineService, settings: ServeSettings, race: Optional[Callable]) -> list:
    """The page's routes. `race(pair, tokenizer, ids, **settings) -> dict` is the race
    (tools/compare.py's, handed in by the CLI: serve/ does not import tools/)."""

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP})

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    async def state(request: Request) -> Response:
        return JSONResponse(server_state(service, settings, race is not None))

    async def run_race(request: Request) -> Response:
        if race is None:
            raise ApiError(404, "this server was started without the race")
        if service.pair.drafter is None:
            raise ApiError(400, "this server decodes plainly (--ar): a race needs the drafter; restart without --ar")
        body = await read_json(request, settings.max_body_bytes)
        ids = race_prompt_ids(body, service.tokenizer, settings, service.pair.target.vocab_size)
        max_tokens = read_max_tokens(body, ("max_tokens",), 128)
        if max_tokens > RACE_MAX_TOKENS:
            raise ApiError(400, f"'max_tokens' {max_tokens} is over a race's limit of {RACE_MAX_TOKENS}", "max_tokens")
        sampling = read_sampling(body, max_temperature=2.0)
        if sampling.seed is None:
            sampling = replace(sampling, seed=0)  # both arms draw from one seed

        def work(svc: EngineService) -> dict:
            return race(svc.pair, svc.tokenizer, ids, svc.request.replace(max_tokens=max_tokens, sampling=sampling),
                        svc.calibration)

        try:
            task = service.submit_task(work)
        except QueueFull:
            raise ApiError(429, f"the server is full ({service.running_limit} running, {service.max_queue} waiting): retry later") from None
        except ShuttingDown:
            raise ApiError(503, "the server is shutting down") from None
        except EngineFailed as e:
            raise ApiError(503, f"the engine stopped ({e}): this server must be restarted") from None
        try:
            record = await task.result()
        except DFlashError as e:
            raise ApiError(400, str(e)) from None
        except EngineFailed as e:
            raise ApiError(503, f"the engine stopped ({e}): this server must be restarted") from None
        prompt = get(body, "prompt", str)
        record.update({"prompt": prompt if prompt is not None else service.tokenizer.decode(ids),
                       "model": settings.model_id, "command": "POST /v1/dflash/race",
                       "created": int(time.time())})
        return JSONResponse(record)

    return [
        Route("/", index), Route("/favicon.ico", favicon),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        Route("/v1/dflash/state", state),
        Route("/v1/dflash/race", run_race, methods=["POST"]),
    ]


def race_prompt_ids(body: dict, tokenizer, settings: ServeSettings, vocab_size: int) -> list[int]:
    """`prompt_token_ids` (a saved race, rerun on the same ids) or `prompt` text, as
    `dflash2 compare` builds it (the chat template around one user turn)."""
    ids = get(body, "prompt_token_ids", list)
    if ids is not None:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ApiError(400, "'prompt_token_ids' must be an array of token ids", "prompt_token_ids")
        check_token_ids(ids, vocab_size, "prompt_token_ids")
    else:
        text = get(body, "prompt", str, required=True)
        try:
            ids = build_prompt(tokenizer, text, None, True, settings.template_kwargs)
        except DFlashError as e:
            raise ApiError(400, str(e), "prompt") from None
    check_prompt_length(ids, settings.max_prompt_tokens or len(ids), "prompt")
    return list(ids)


def server_state(service: EngineService, settings: ServeSettings, can_race: bool) -> dict:
    """What the page's state view shows; read between tokens, so figures may be one step old."""
    pair, pool, m = service.pair, service.pool, service.metrics
    target, drafter = pair.target, pair.drafter
    cal = service.calibration
    tau = m.committed / m.target_passes if m.target_passes else None
    return {
        "model": settings.model_id,
        "pair": {
            "kind": pair.kind,
            "target": {"model_type": target.model_type, "layers": target.num_layers,
                       "hidden_size": target.hidden_size, "vocab_size": target.vocab_size},
            "drafter": None if drafter is None else {
                "kind": drafter.config.kind, "layers": len(drafter.layers),
                "hidden_size": drafter.config.hidden_size, "block_size": drafter.config.block_size},
            "block_size": service.request.block_size if service.request.block_size is not None
            else pair.max_block_size,
            "tree_rows": service.request.tree_rows,
        },
        # One table per context length the costs were measured at (auto interpolates between them).
        "costs": None if cal is None else {
            "by_context": {str(c): t.to_dict() for c, t in cal.costs.contexts.items()},
            "acceptance": cal.acceptance, "cached": cal.cached, "rescaled": cal.rescaled},
        "queue": {"waiting": service.queue_length, "busy": service.busy, "max_queue": service.max_queue,
                  "running": max(service.active, int(service.busy)), "max_batch": service.running_limit,
                  "batch_note": service.batch_note},
        "prompt_cache": {"entries": len(pool), "bytes": pool.nbytes, "max_bytes": pool.settings.memory_bytes,
                         "disk": pool.settings.folder is not None, **pool.stats()},
        "totals": {"generations": m.generations, "generation_tokens": m.generation_tokens,
                   "prompt_tokens": m.prompt_tokens, "cached_prompt_tokens": m.cached_prompt_tokens,
                   "target_passes": m.target_passes, "mean_acceptance_length": tau,
                   "drafted": m.drafted, "accepted": m.accepted},
        "machine": {"backend": backend_name(), "device": platform.machine(), "platform": platform.platform()},
        "race": can_race and drafter is not None,
    }
