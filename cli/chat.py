"""`dflash2 chat`: a terminal chat that keeps the conversation in the caches."""

import signal
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from dflash2_mlx.errors import DFlashError, PromptTooLongError

from . import distributed, inputs
from . import options as o
from .cache_dir import CacheDir, check_cache_dir
from .progress import PrefillProgress
from . import ui


def chat(
    model: o.Model = "builtin",
    drafter: o.Drafter = None,
    max_tokens: o.MaxTokens = 512,
    temp: o.Temp = 0.0,
    top_p: o.TopP = 1.0,
    top_k: o.TopK = 0,
    min_p: o.MinP = 0.0,
    seed: o.Seed = None,
    block_size: o.BlockSize = "auto",
    recalibrate: o.Recalibrate = False,
    tree: o.Tree = 0,
    draft_quant: o.DraftQuant = None,
    draft_window: o.DraftWindow = None,
    cache_dir: CacheDir = None,
    system_prompt: o.SystemPrompt = None,
    ignore_chat_template: o.IgnoreChatTemplate = False,
    chat_template_config: o.ChatTemplateConfig = None,
    ar: o.AR = False,
    color: o.Color = True,
    processes: o.Processes = None,
    hostfile: o.Hostfile = None,
    rank_timeout: o.RankTimeout = 300.0,
    time_collectives: o.TimeCollectives = True,
    debug: o.Debug = False,
):
    """Chat with a model in the terminal; DFlash 2 speculative decoding unless --ar.

    Each turn prefills only its new tokens: the conversation stays in the target's
    and drafter's caches. Type /help for commands; Ctrl-C stops an answer.
    With --processes / --hostfile the target is split over ranks; every rank
    reads the same input (mlx.launch relays it) and Ctrl-C ends the chat.
    """
    request = inputs.decode_request(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                                    seed=seed, block_size=block_size, tree=tree, ar=ar)
    inputs.check_drafter_flags(ar, draft_quant, draft_window)
    template_kwargs = inputs.parse_template_config(chat_template_config)
    drafter = inputs.drafter_for(model, drafter, ar)
    if cache_dir is not None:
        check_cache_dir(cache_dir)
    if distributed.wants_ranks(processes, hostfile):
        if cache_dir is not None:  # each rank holds another shard of the target's caches
            raise DFlashError("--cache-dir does not work with --processes/--hostfile yet: leave it out")
        # The ranks never see the end of their stdin: end the chat for them.
        return distributed.relaunch(model, processes, hostfile, relay_stdin=b"/quit\n")
    rank = distributed.start_rank(rank_timeout) if distributed.in_rank() else None

    from dflash2_mlx.device import backend_name
    from dflash2_mlx.engine.plan import fit
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.chat_session import ChatSession
    from dflash2_mlx.text.prompt import probe_prompt
    from dflash2_mlx.text.stats import mode_name

    ui.progress_note("loading models…")
    pair, tokenizer = load_pair(model, drafter, draft_quant, group=rank.group if rank else None,
                                time_collectives=time_collectives, draft_window=draft_window)
    fit(pair, request)  # a block or tree this drafter cannot draft: before a calibration
    # No conversation yet: a measurement (first use on this machine only) reads a built-in prompt.
    probe = probe_prompt(tokenizer)
    request, calibration = inputs.calibrate(pair, request, probe, recalibrate, ranks=rank is not None)
    view = ui.ChatView(color=color)
    prompt_cache = None
    if cache_dir is not None:  # disk only: the session's own caches are the memory tier
        from dflash2_mlx.text.prompt_cache import CacheSettings, PromptCache

        prompt_cache = PromptCache(pair, CacheSettings(memory_bytes=0, folder=cache_dir), warn=view.notice)
    session = ChatSession(
        pair, tokenizer, system_prompt=system_prompt, use_chat_template=not ignore_chat_template,
        template_kwargs=template_kwargs, request=request, calibration=calibration, prompt_cache=prompt_cache,
    )
    rows = [("model", model)]
    if pair.drafter is not None:
        shown = f"auto ≤ {pair.max_block_size}" if request.auto else (request.block_size or pair.max_block_size)
        shape = f"tree {tree} rows" if tree else f"block {shown}"
        rows.append(("drafter", f"{drafter} ({mode_name(pair.kind)}, {shape})"))
    else:
        rows.append(("decoding", "plain autoregressive (--ar)"))
    rows += [("max tokens", f"{max_tokens:,}"), ("temperature", f"{temp:g}"), ("backend", backend_name())]
    if rank is not None:
        rows.append(("ranks", f"{rank.group.size()} (the target split over them)"))
    if system_prompt:
        rows.append(("system", system_prompt if len(system_prompt) <= 60 else system_prompt[:57] + "..."))
    if not session.use_chat_template:
        rows.append(("template", "none (raw text)"))
    if cache_dir is not None:
        rows.append(("cache", str(cache_dir)))
    view.header(rows)
    if model == "builtin":
        view.notice(ui.builtin_notice(pair.target))
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # not on every platform
        pass
    try:
        chat_loop(session, input if rank is None else rank.reader(input, pair.target), view)
    finally:
        session.close()  # --cache-dir: the blocks still queued reach the disk before the chat ends


@dataclass(frozen=True)
class Command:
    name: str  # help, reset, system, set, stats, color, quit, unknown; "" for a message
    arg: str = ""


_ALIASES = {
    "/help": "help", "/?": "help", "/reset": "reset", "/clear": "reset", "/system": "system",
    "/set": "set", "/stats": "stats", "/color": "color", "/colour": "color",
    "/quit": "quit", "/exit": "quit", "/bye": "quit",
}


def parse_command(line: str) -> Command:
    """A line of input as a command, or a message (`name` "")."""
    text = line.strip()
    if text == "q":
        return Command("quit")
    if not text.startswith("/"):
        return Command("", line)
    word, _, rest = text.partition(" ")
    return Command(_ALIASES.get(word.lower(), "unknown"), rest.strip() if word.lower() in _ALIASES else word)


def read_message(read_line: Callable[[str], str], view) -> str:
    """One message; a line starting with \"\"\" continues until a line ending with \"\"\"."""
    line = read_line(view.prompt())
    if not line.lstrip().startswith('"""'):
        return line
    text = line.lstrip()[3:]
    lines = []
    while True:
        if text.rstrip().endswith('"""'):
            lines.append(text.rstrip()[:-3])
            return "\n".join(lines)
        lines.append(text)
        text = read_line(view.prompt(continuation=True))


class _StopOnInterrupt:
    """While an answer streams, Ctrl-C asks it to stop at the next token (so the
    caches stay at a token boundary); a second Ctrl-C interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def chat_loop(session, read_line: Callable[[str], str], view, on_token: Optional[Callable] = None) -> None:
    """The read-answer loop. `read_line(prompt)` returns a line, raising EOFError
    at the end of input and KeyboardInterrupt on Ctrl-C. `on_token(response)`,
    if given, is called after each streamed token (tests raise from it)."""
    interrupted_at_prompt = False
    while True:
        try:
            line = read_message(read_line, view)
        except EOFError:
            view.notice("bye")
            return
        except UnicodeDecodeError as e:  # input() decodes strictly; the turn is skipped, the chat goes on
            view.error(f"that line is not valid UTF-8 text (byte 0x{e.object[e.start]:02x}): type it again")
            continue
        except KeyboardInterrupt:
            view.console.print()
            if interrupted_at_prompt:
                view.notice("bye")
                return
            interrupted_at_prompt = True
            view.notice("(Ctrl-C again, /quit or Ctrl-D to leave)")
            continue
        interrupted_at_prompt = False
        command = parse_command(line)
        try:
            if command.name == "quit":
                view.notice("bye")
                return
            if command.name == "":
                if line.strip():
                    _answer(session, line, view, on_token)
            else:
                _run_command(session, command, view)
        except DFlashError as e:
            view.error(str(e))


def _answer(session, text: str, view, on_token) -> None:
    with _StopOnInterrupt() as stop, PrefillProgress.on_stderr() as progress:

        def show(r):
            view.token(r.text, r.from_draft)
            if on_token is not None:
                on_token(r)
            if stop.requested:
                raise KeyboardInterrupt

        # Only when drawn: a session stand-in (tests) may take `on_token` alone.
        drawn = {} if progress.callback is None else {"prompt_progress_callback": progress.callback}
        try:
            result = session.ask(text, on_token=show, **drawn)
        except PromptTooLongError as e:  # the conversation is kept as it was
            raise DFlashError(_too_long(e)) from None
    view.end_answer(result)


def _too_long(e: PromptTooLongError) -> str:
    """The library's refusal in the chat's own terms (its commands)."""
    where = "over" if e.prompt_tokens > e.limit else "all of"
    return (f"the conversation would have {e.prompt_tokens:,} tokens, {where} this model's context of "
            f"{e.limit:,}: /reset to start a new one, or send a shorter message")


def _run_command(session, command: Command, view) -> None:
    name, arg = command.name, command.arg
    if name == "help":
        view.show(ui.chat_help())
    elif name == "reset":
        session.reset()
        view.notice("conversation cleared")
    elif name == "system":
        if not arg:
            view.notice(f"system prompt: {session.system_prompt!r}" if session.system_prompt else "no system prompt")
            return
        session.set_system_prompt(arg)
        view.notice("system prompt set (the next turn re-reads the conversation with it)")
    elif name == "set":
        if not arg:
            r = session.request
            s = r.sampling
            B = r.block_size or (session.drafter.config.block_size if session.drafter else None)
            view.notice(f"temp {s.temperature:g} · top_p {s.top_p:g} · top_k {s.top_k} · min_p {s.min_p:g} · "
                        f"max_tokens {r.max_tokens} · block_size {B if session.drafter else '- (plain decoding)'} · "
                        f"tree {r.tree_rows or '0 (the chain)'}")
            return
        key, _, value = arg.partition(" ")
        if not value.strip():
            raise DFlashError(f"/set {key} needs a value, e.g. /set temp 0.7")
        view.notice(session.set(key, value.strip()))
    elif name == "stats":
        view.show(ui.turn_stats(session.last))
    elif name == "color":
        view.color = not view.color
        view.notice(f"drafted tokens {'coloured' if view.color else 'not coloured'}")
    else:
        view.error(f"unknown command {arg} (try /help)")
