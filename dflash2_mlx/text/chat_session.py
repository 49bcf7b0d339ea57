"""A multi-turn chat session that keeps the conversation in the caches.

Each turn renders the whole conversation with the target's chat template and
feeds the model only what its caches do not hold yet, so a turn prefills its
new tokens and nothing else. The caches hold exactly what the model read and
wrote (its own answer tokens, not a re-tokenization of their text), as
mlx-lm's prompt cache does. No UI here: the CLI drives `ask` and renders.
"""

from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..engine.adaptive.calibrate import measure
from ..engine.adaptive.policy import auto_decides
from ..engine.decode.loop import DecodeCache
from ..engine.pair import Pair
from ..engine.plan import fit
from ..engine.request import DecodeRequest, RequestError
from ..errors import DFlashError
from .context import check_context
from .generate import GenerationResponse, stream_generate
from .prompt import render_conversation
from .stats import GenerationStats


@dataclass(frozen=True)
class TurnResult:
    """One answer and how it was produced."""

    text: str
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    finish_reason: str  # "stop", "length" or "interrupted"
    stats: Optional[GenerationStats]  # None when interrupted (no final response)
    last: Optional[GenerationResponse]  # the last response seen (speeds so far)
    prompt_ids: tuple[int, ...]  # the whole conversation the model read this turn
    reused_tokens: int  # of those, already in the caches
    prefilled_tokens: int  # run through the target this turn (the new tokens)
    rewound: bool  # cached tokens the template renders differently were dropped
    note: str = ""  # what the session did to keep its caches consistent, if anything
    disk_tokens: int = 0  # of reused_tokens, read from the prompt cache's disk tier (--cache-dir)

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == "interrupted"


# Settings `/set NAME VALUE` can change, with their types (block_size: the request reads the text).
SETTINGS = {"temp": float, "top_p": float, "top_k": int, "min_p": float, "max_tokens": int,
            "block_size": str, "tree": int}
# "/set top_k needs an integer, not 'x'"
_A_TYPE = {int: "an integer", float: "a number"}


class ChatSession:
    """A conversation with a pair (plain decoding when it has no drafter)."""

    def __init__(
        self,
        pair: Pair,
        tokenizer,
        *,
        system_prompt: Optional[str] = None,
        use_chat_template: bool = True,
        template_kwargs: Optional[dict] = None,
        request: DecodeRequest = DecodeRequest(max_tokens=512),
        calibration=None,
        prompt_cache=None,
    ):
        self.pair, self.tokenizer = pair, tokenizer
        # A `text.prompt_cache.PromptCache` (`chat --cache-dir`): a conversation
        # whose blocks an earlier session kept starts from them.
        self.prompt_cache = prompt_cache
        self.target, self.drafter = pair.target, pair.drafter
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.template_kwargs = dict(template_kwargs or {})
        fit(pair, request)  # a block or tree this drafter cannot draft fails now, not at the first turn
        self.request = request  # every turn's settings; /set changes them
        self.calibration = calibration  # for block_size "auto" (measured on first use when None)
        self.messages: list[dict] = []
        self.last: Optional[TurnResult] = None
        self.cache = self._new_cache()

    # -- settings ---------------------------------------------------------------
    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.messages = []
        self.last = None
        self.cache = self._new_cache()

    def close(self) -> None:
        """The end of the chat: wait until the prompt cache's new blocks are on disk."""
        if self.prompt_cache is not None:
            self.prompt_cache.close()

    def set_system_prompt(self, text: Optional[str]) -> None:
        """Takes effect next turn; the conversation is kept (and re-read, since
        its rendering now starts differently)."""
        self.system_prompt = text or None

    def set(self, name: str, raw: str) -> str:
        """Change one setting from text; returns how it now reads. Raises
        DFlashError naming the problem on a bad name or value."""
        name = name.replace("-", "_")
        name = {"temperature": "temp"}.get(name, name)
        if name not in SETTINGS:
            raise DFlashError(f"unknown setting '{name}': use one of {', '.join(SETTINGS)}")
        try:
            value = SETTINGS[name](raw)
        except ValueError:
            raise DFlashError(f"/set {name} needs {_A_TYPE.get(SETTINGS[name], SETTINGS[name].__name__)}, not '{raw}'") from None
        if name == "block_size" and self.drafter is None:
            raise DFlashError("block size does nothing with plain decoding (no drafter)")
        try:
            if name in ("temp", "top_p", "top_k", "min_p"):
                field = {"temp": "temperature"}.get(name, name)
                request = self.request.replace(sampling=replace(self.request.sampling, **{field: value}))
            else:  # checked as any request is, then against this pair's drafter
                request = self.request.replace(**{{"tree": "tree_rows"}.get(name, name): value})
            fit(self.pair, request)
        except RequestError as e:  # told with the setting's name, as typed after /set
            text = str(e)
            raise DFlashError(name + text[len(e.field):] if text.startswith(e.field) else text) from None
        self.request = request
        return f"{name} = {value}"

    def _new_cache(self) -> DecodeCache:
        return DecodeCache(self.target.make_cache(), self.drafter.make_cache() if self.drafter else None)

    # -- rendering ----------------------------------------------------------------
    def render(self, messages: list[dict]) -> str:
        """The conversation as the model reads it, ending with the assistant's cue."""
        return render_conversation(
            self.tokenizer, messages, system_prompt=self.system_prompt,
            use_chat_template=self.use_chat_template, template_kwargs=self.template_kwargs,
        )[0]

    def _encode(self, text: str, whole: bool) -> list[int]:
        if self.use_chat_template or not whole:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(self.tokenizer.encode(text))

    def _plan(self, text: str) -> tuple[list[int], int, bool]:
        """(conversation ids for this turn, tokens reusable from the cache, rewound)."""
        rendered = self.render(self.messages + [{"role": "user", "content": text}])
        cached = self.cache.tokens
        if cached:
            # Usual case: the template renders the history exactly as the model
            # read and wrote it, so the text of the cached tokens is a prefix of
            # the rendering; only the text after it is new. (Comparing text, not
            # ids, keeps the model's own answer tokens even where re-encoding
            # their text would split it differently.)
            seen = self.tokenizer.decode(cached)
            if rendered.startswith(seen):
                return cached + self._encode(rendered[len(seen):], whole=False), len(cached), False
        # Otherwise (first turn, /system changed, or a template that re-renders
        # history differently, e.g. Qwen3 dropping <think> blocks from earlier
        # answers): keep the longest common prefix of ids and re-read the rest.
        ids = self._encode(rendered, whole=True)
        common = 0
        for a, b in zip(cached, ids):
            if a != b:
                break
            common += 1
        return ids, common, common < len(cached)

    # -- a turn ---------------------------------------------------------------------
    def ask(self, text: str, on_token: Optional[Callable[[GenerationResponse], None]] = None,
            prompt_progress_callback: Optional[Callable[[int, int], None]] = None) -> TurnResult:
        """Answer `text`, calling `on_token` with each response as it streams
        (and `prompt_progress_callback(done, total)` through the prefill of
        the turn's new tokens). A conversation that fills the target's context
        raises `PromptTooLongError`, and nothing changes.

        A KeyboardInterrupt (from `on_token`, or Ctrl-C while the model runs)
        ends the answer early: the partial answer joins the conversation and the
        caches are left holding exactly it, so the next turn continues cleanly.
        """
        if not text or not text.strip():
            raise DFlashError("the message is empty")
        ids, reuse, rewound = self._plan(text)
        check_context(self.target, len(ids), "the conversation")  # before any work
        if reuse == 0 and self.cache.tokens:
            self.cache = self._new_cache()
        elif reuse < len(self.cache.tokens):
            self.cache.truncate(reuse)
            if self.cache.stale:  # recurrent layers cannot rewind: read it all again
                self.cache, reuse = self._new_cache(), 0
        # The caches hold all reused tokens but the last, which is fed again.
        prompt, disk = (ids[reuse - 1:] if reuse else ids), 0
        if self.prompt_cache is not None:
            prompt, reuse, disk, ran = self._from_blocks(ids, reuse, prompt_progress_callback)
            prompt_progress_callback = _after(prompt_progress_callback, ran)
        held = len(self.cache.tokens)
        if self.calibration is None and auto_decides(self.pair, self.request.block_size, self.request.tree_rows):
            self.calibration = measure(self.pair, prompt)  # once per session (the CLI passes a cached one)
        responses = stream_generate(self.pair, self.tokenizer, prompt, self.request, calibration=self.calibration,
                                    prompt_cache=self.cache, prompt_progress_callback=prompt_progress_callback)
        tokens, flags, last, interrupted = [], [], None, False
        try:
            for r in responses:
                tokens.append(r.token)
                flags.append(r.from_draft)
                last = r
                if on_token is not None:
                    on_token(r)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            responses.close()  # rewinds the caches to the tokens returned
        note = self._repair(len(ids) + len(tokens) if tokens else held)
        if self.prompt_cache is not None:
            self.prompt_cache.keep_blocks(self.cache)  # written on the cache's own thread, while the user reads
        if not tokens:
            # Stopped before the first token: as if the question was never asked.
            result = TurnResult("", (), (), "interrupted", None, None, tuple(ids), reuse, len(prompt), rewound, note,
                                disk)
            self.last = result
            return result
        eos = set(getattr(self.tokenizer, "eos_token_ids", None) or [])
        content_ids = tokens[:-1] if tokens and tokens[-1] in eos else tokens
        answer = self.tokenizer.decode(content_ids)
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        finish = "interrupted" if interrupted else (last.finish_reason or "length")
        result = TurnResult(
            answer, tuple(tokens), tuple(flags), finish, None if interrupted else last.stats, last,
            tuple(ids), reuse, len(prompt), rewound, note, disk,
        )
        self.last = result
        return result

    def _from_blocks(self, ids: list[int], reuse: int, progress) -> tuple[list[int], int, int, int]:
        """Start a fresh conversation from the prompt cache's blocks, and keep
        this turn's whole blocks: (prompt still to run, reused tokens, of them
        from disk, tokens the blocks ran now)."""
        if reuse == 0:
            self.cache, prompt, got = self.prompt_cache.prepare(ids, self.request.prefill_step_size, progress)
            return prompt, got.tokens, got.disk, len(ids) - len(prompt) - got.tokens
        self.prompt_cache.extend(self.cache, ids, self.request.prefill_step_size, progress)
        prompt = ids[len(self.cache.tokens) - 1:]
        return prompt, reuse, 0, len(ids) - len(prompt) - (reuse - 1)

    def _repair(self, want: int) -> str:
        """Make sure the caches hold `want` tokens (all but the last one run).

        An interruption at a token boundary leaves them consistent already; one
        in the middle of a forward (Ctrl-C during prefill or a verify) can leave
        rows past that point, which are trimmed. If rows are missing, the
        caches are dropped and the next turn reads the conversation again.
        """
        cache = self.cache
        if len(cache.tokens) > want:
            del cache.tokens[want:]
        if len(cache.tokens) < want or cache.stale:
            self.cache = self._new_cache()
            return "the caches could not be rewound to the end of this answer; the next turn reads the conversation again"
        keep = max(len(cache.tokens) - 1, 0)
        cache.cut_unread(keep)  # the rows the drafter has not read: cut with the tokens,
        cache.catch_up(self.drafter)  # then read now, so the checks below see level caches
        for layers in (cache.target, cache.drafter):
            for c in layers or []:
                offset = getattr(c, "offset", keep)
                if offset < keep or (offset > keep and not (hasattr(c, "trim") and c.is_trimmable())):
                    self.cache = self._new_cache()
                    return "the caches could not be rewound to the end of this answer; the next turn reads the conversation again"
                if offset > keep:
                    c.trim(offset - keep)
        return ""

    # -- turns as text ------------------------------------------------------------
    @property
    def context_tokens(self) -> int:
        return len(self.cache.tokens)


def _after(progress, done: int):
    """`progress` for the rest of a prompt whose first `done` tokens the
    prompt cache's blocks already ran this turn (one bar, not two)."""
    if progress is None or done <= 0:
        return progress
    return lambda d, total: progress(d + done, total + done)
