"""`dflash2 serve`: an OpenAI- and Anthropic-compatible HTTP server."""

import ipaddress
import re
import signal
import socket
import sys
from typing import Annotated, Optional

import typer

from dflash2_mlx.errors import DFlashError

from . import distributed, inputs
from . import options as o
from .cache_dir import CacheDir, check_cache_dir
from .user_cache import cache_folder

Host = Annotated[str, typer.Option("--host", help="Address to bind; anything but loopback needs --api-key or --allow-unauthenticated.")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to bind, 0..65535 (0: any free port, printed at start).")]
ApiKey = Annotated[
    Optional[str],
    typer.Option("--api-key", envvar="DFLASH2_API_KEY",
                 help="Require this key ('Authorization: Bearer KEY' or 'x-api-key: KEY'); also read from DFLASH2_API_KEY."),
]
AllowUnauthenticated = Annotated[
    bool, typer.Option("--allow-unauthenticated", help="Serve a non-loopback --host without an API key (anyone who can reach it may use it)."),
]
MaxPromptTokens = Annotated[
    Optional[int],
    typer.Option("--max-prompt-tokens", help="Refuse prompts longer than this (400); default: the model's context "
                                             "(prompt and max_tokens must fit it in any case)."),
]
CacheBytes = Annotated[
    str, typer.Option("--cache-bytes", help="Prompt cache bound in memory, e.g. 4GB, 512MB or bytes (0 = off), for its blocks and, apart, its conversation tails; least recently used go first."),
]
CacheDiskBytes = Annotated[
    str, typer.Option("--cache-disk-bytes", help="Disk bound of --cache-dir, e.g. 16GB (least recently used blocks go first)."),
]
CacheSnapshotEvery = Annotated[
    Optional[int],
    typer.Option("--cache-snapshot-every", metavar="N",
                 help="Recurrent and sliding-window targets: keep their state in the prompt cache every N blocks of "
                      "256 tokens and at each prompt's end (fewer bytes; a prefix resumes at a kept one). Default: 4.",
                 show_default=False),
]
MaxQueue = Annotated[int, typer.Option("--max-queue", help="Requests that may wait while the batch is full; more get 429.")]
MaxBatch = Annotated[
    Optional[int],
    typer.Option("--max-batch", help="Requests that share each target pass (continuous batching, docs/batching.md); "
                                     "default: as many as their caches fit in a quarter of the memory, at most 8. "
                                     "1: one request at a time.", show_default=False),
]
ServedModelName = Annotated[
    Optional[list[str]],
    typer.Option("--served-model-name", help="A name /v1/models lists (repeat for more; the first is what responses "
                                             "carry). Any requested model is answered by the loaded pair.",
                 show_default=False),
]
StrictModelName = Annotated[
    bool, typer.Option("--strict-model-name", help="Refuse (404) requests whose model is not a served name."),
]
DefaultMaxTokens = Annotated[int, typer.Option("--max-tokens", "-m", help="max_tokens for OpenAI requests that do not set it.")]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def serve(
    model: o.Model = "builtin",
    drafter: o.Drafter = None,
    host: Host = "127.0.0.1",
    port: Port = 8080,
    api_key: ApiKey = None,
    allow_unauthenticated: AllowUnauthenticated = False,
    block_size: o.BlockSize = "auto",
    recalibrate: o.Recalibrate = False,
    tree: o.Tree = 0,
    draft_quant: o.DraftQuant = None,
    draft_window: o.DraftWindow = None,
    max_prompt_tokens: MaxPromptTokens = None,
    max_tokens: DefaultMaxTokens = 512,
    cache_bytes: CacheBytes = "4GB",
    cache_dir: CacheDir = None,
    cache_disk_bytes: CacheDiskBytes = "16GB",
    cache_snapshot_every: CacheSnapshotEvery = None,
    max_queue: MaxQueue = 32,
    max_batch: MaxBatch = None,
    chat_template_config: o.ChatTemplateConfig = None,
    served_model_name: ServedModelName = None,
    strict_model_name: StrictModelName = False,
    ar: o.AR = False,
    processes: o.Processes = None,
    hostfile: o.Hostfile = None,
    rank_timeout: o.RankTimeout = 300.0,
    time_collectives: o.TimeCollectives = True,
    debug: o.Debug = False,
):
    """Serve the pair over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/responses,
    /v1/models), Anthropic (/v1/messages, /v1/messages/count_tokens) and a page at / (chat,
    the race of plain decoding against the pair, the server's state), with DFlash 2 decoding
    (or --ar), a prompt cache across requests, /health and /metrics. Ctrl-C or SIGTERM
    drains and exits; a second stops at once (status 130 or 143).

    With --processes N or --hostfile FILE the target is split over N ranks;
    rank 0 serves HTTP, the others run the same generations with it."""
    limit = parse_bytes(cache_bytes)
    disk_limit = parse_bytes(cache_disk_bytes, "--cache-disk-bytes")
    if cache_dir is not None:
        check_cache_dir(cache_dir)
    elif cache_disk_bytes != "16GB":
        import warnings

        warnings.warn("--cache-disk-bytes does nothing without --cache-dir (the prompt cache stays in memory)")
    if cache_snapshot_every is not None and cache_snapshot_every < 1:
        raise DFlashError(f"--cache-snapshot-every {cache_snapshot_every} must be at least 1 "
                          "(1: a snapshot at every block)")
    if max_queue < 0:
        raise DFlashError(f"--max-queue {max_queue} must be 0 or more")
    if max_batch is not None and max_batch < 1:
        raise DFlashError(f"--max-batch {max_batch} must be at least 1 (1: one request at a time)")
    # The server's settings every request starts from, checked as a request's.
    request = inputs.decode_request(max_tokens=max_tokens, temp=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                                    block_size=block_size, tree=tree, ar=ar)
    inputs.check_drafter_flags(ar, draft_quant, draft_window)
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise DFlashError(f"--max-prompt-tokens {max_prompt_tokens} must be at least 1")
    if served_model_name and not all(name.strip() for name in served_model_name):
        raise DFlashError("--served-model-name is empty: give the name clients will see")
    if api_key is not None and not api_key.strip():
        raise DFlashError("--api-key is empty: give a key, or leave the option out on loopback")
    if not is_loopback(host) and api_key is None and not allow_unauthenticated:
        raise DFlashError(f"--host {host} is reachable from other machines: set --api-key KEY, "
                          "or pass --allow-unauthenticated to serve it open on purpose")
    template_kwargs = inputs.parse_template_config(chat_template_config)
    drafter = inputs.drafter_for(model, drafter, ar)
    if distributed.wants_ranks(processes, hostfile):
        if cache_dir is not None:  # every rank must reuse the same prefixes, and each holds another shard
            raise DFlashError("--cache-dir does not work with --processes/--hostfile yet: leave it out "
                              "(the memory prompt cache still works)")
        bind(host, port).close()  # a taken port: one line before any rank starts
        return distributed.relaunch(model, processes, hostfile, serving=True)
    rank = distributed.start_rank(rank_timeout) if distributed.in_rank() else None
    sock = bind(host, port) if rank is None or rank.rank == 0 else None

    import uvicorn

    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.serve.app import create_app
    from dflash2_mlx.serve.drain import Drain
    from dflash2_mlx.serve.service import EngineService
    from dflash2_mlx.serve.settings import ServeSettings

    def load():  # runs on the engine's thread (MLX streams are per thread)
        return load_pair(model, drafter, draft_quant, group=rank.group if rank else None,
                         time_collectives=time_collectives, draft_window=draft_window)

    # The service checks the request against the pair and reads (or measures once) the costs auto needs.
    service = EngineService(load, request=request, calibration_folder=cache_folder(), recalibrate=recalibrate,
                            max_queue=max_queue, cache_bytes=limit, cache_dir=cache_dir,
                            cache_disk_bytes=disk_limit, cache_snapshot_every=cache_snapshot_every,
                            max_batch=max_batch)
    if rank is not None:
        _join_ranks(service, rank)
        if rank.rank != 0:
            service.follow()  # until rank 0 sends the stop job
            return
    print("loading models…", file=sys.stderr)
    pair, _ = _start(service)
    names = tuple(served_model_name or ()) or (getattr(model, "given", model),)  # `smollm2`, not its cache folder
    settings = ServeSettings(model_id=names[0], api_key=api_key, max_prompt_tokens=max_prompt_tokens,
                             default_max_tokens=max_tokens, template_kwargs=template_kwargs,
                             aliases=names[1:], strict_model_names=strict_model_name)
    drain = Drain()
    from dflash2_mlx.tools.compare import race

    app = create_app(service, settings, drain, race=race)
    bound = sock.getsockname()
    mode = "plain autoregressive" if pair.drafter is None else pair.kind
    print(f"serving '{names[0]}' ({mode}) on http://{_url_host(bound[0])}:{bound[1]}  "
          "(open it in a browser for the page; OpenAI /v1/chat/completions and /v1/responses, "
          "Anthropic /v1/messages; "
          "Ctrl-C stops)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="info" if debug else "warning", access_log=debug,
                            timeout_graceful_shutdown=_AFTER_DRAIN_S)
    _log_notes(debug)
    # Uvicorn raises a signal it shut down for again, for the default action;
    # ignoring that delivery lets a drained server exit 0 instead of dying by it.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _draining_server(uvicorn.Server, config, drain, service).run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if service.failure is not None:  # non-zero, so that a supervisor restarts the server
        raise DFlashError(f"the engine stopped ({service.failure}): the server exited; restart it")
    print("stopped", file=sys.stderr)


def _log_notes(debug: bool) -> None:
    """The server's notes (a tool left out of the prompt, a schema relaxed: INFO) on stderr as
    plain lines; with --debug also the engine's tracebacks (DEBUG; else a failure is one line)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("dflash2")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    logger.propagate = False


_DRAIN_S = 60.0  # the longest a drain waits for the requests it holds
_AFTER_DRAIN_S = 5  # then uvicorn's own shutdown, for connections still open


def _draining_server(base, config, drain, service):
    """A uvicorn server that drains at the application first: on the first
    SIGINT/SIGTERM the socket stays open, new requests get 503 (serve/drain.py)
    and the held ones finish (up to _DRAIN_S); then uvicorn shuts down as
    usual. A second signal stops at once (`_stop_now`). An engine that died
    (`service.failure`) stops the server the same way as a drain: the requests
    it held have had their 503 already."""
    import time

    class DrainingServer(base):
        deadline = None

        def handle_exit(self, sig, frame):
            if drain.draining or self.should_exit:
                _stop_now(sig, drain.held)
            drain.start()
            self.deadline = time.monotonic() + _DRAIN_S
            held = f"finishing {drain.held} request(s) in progress; " if drain.held else ""
            print(f"stopping: {held}new requests get 503 (Ctrl-C again to stop now)", file=sys.stderr, flush=True)

        async def on_tick(self, counter: int) -> bool:
            if service.failure is not None and not drain.draining:
                drain.start()
                self.deadline = time.monotonic()
            if drain.draining and not self.should_exit and (drain.idle or time.monotonic() > self.deadline):
                self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer(config)


def _stop_now(sig, held: int) -> None:
    """The second Ctrl-C (or SIGTERM): one line and out, at once. The requests still
    held are cut (their connections close); the engine thread may be inside MLX,
    where the interpreter's own exit would abort, so the process ends here."""
    import os

    from .stdio import INTERRUPTED
    from .terminate import TERMINATED

    what = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    cut = f"{held} request was cut" if held == 1 else f"{held} requests were cut"
    print(f"error: stopped at the second {what}; {cut}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(INTERRUPTED if sig == signal.SIGINT else TERMINATED)


def _start(service):
    """`service.start()`; a Ctrl-C or SIGTERM while the engine thread still
    loads ends the process there and then, with its one line: MLX aborts the
    interpreter's exit while another thread is inside it. The loader writes
    nothing but the calibration cache, and that by a rename (a leftover
    temporary is overwritten by the next measurement)."""
    import os

    from .stdio import report_interrupted
    from .terminate import Terminated, report_terminated

    try:
        return service.start()
    except (KeyboardInterrupt, Terminated) as e:
        code = report_terminated() if isinstance(e, Terminated) else report_interrupted()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _join_ranks(service, rank) -> None:
    """Wire the service to the other ranks (dflash2_mlx/serve/ranks.py). The
    watchdog runs only while a generation does; a follower ignores SIGINT and
    SIGTERM (rank 0 drains, then sends it the stop job)."""
    import os

    from dflash2_mlx.serve.ranks import JobChannel

    from . import errors

    def busy(on: bool) -> None:
        if on:
            rank.watch(service.pair.target)
        else:
            rank.watchdog.arm(None)

    def fatal(message: str) -> None:
        errors.fail(message)
        sys.stderr.flush()
        os._exit(1)

    service.channel, service.on_busy, service.on_fatal = JobChannel(rank.group), busy, fatal
    if rank.rank != 0:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def parse_bytes(text: str, flag: str = "--cache-bytes") -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise DFlashError(f"{flag} '{text}' is not a size: use e.g. 4GB, 512MB, 0 or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """Bind here, before loading, so a taken port is one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise DFlashError(f"cannot listen on {host}:{port} ({e.strerror}): pick another --port or --host") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
