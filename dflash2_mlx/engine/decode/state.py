"""What the decode loop keeps between target passes, and what one pass commits.

`DecodeCache` holds the target and drafter caches and the committed tokens;
`commit` is the one place a cycle's tokens and its undo record are written.
`CycleOutcome` is what every cycle (chain, tree or plain step) hands the
loop's one commit tail; `DecodeStep` is what the loop yields.
"""

from dataclasses import dataclass, field
from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from ...errors import DFlashError
from ..grammar import GrammarState
from ..request import DecodeRequest
from ..sampling import SamplingParams
from ..target.adapter import Target, Undo
from .rows import RowRule

# Pending feature rows pushed into the drafter cache at once during long plain
# runs (bounds the memory the captured features hold).
FLUSH_ROWS = 256


@dataclass(frozen=True)
class DecodeStep:
    """Tokens committed by one target pass (prefill, verify or plain step)."""

    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    drafted: int = 0  # draft positions in this pass (B - 1, a tree's depth); 0 for prefill/plain
    accepted: int = 0  # of those, how many the target accepted
    verify_rows: int = 0  # rows the target ran (B, a tree's rows, 1 for a plain step); 0 for prefill
    logprobs: Optional[tuple] = None  # a rows.TokenLogprobs per token, when asked for


@dataclass(frozen=True)
class LastVerify:
    """The undo record of the verify block the target cache ends with, cut to
    the rows it kept: lets `DecodeCache.truncate` replay a shorter prefix of a
    recurrent target's state (an EOS or stop string ended the answer inside
    the block) instead of marking the cache stale."""

    target: Target
    undo: Undo

    @classmethod
    def after_rollback(cls, target: Target, undo: Undo, keep: int) -> Optional["LastVerify"]:
        """What to keep after `target.rollback(cache, undo, keep)`; None when every
        cache trims exactly (nothing recurrent to replay)."""
        if undo.snapshot is None:
            return None
        return cls(target, undo.kept(keep))

    @property
    def rows(self) -> int:
        return self.undo.tokens.shape[1]

    @property
    def start(self) -> int:
        """Cache offset before the verify forward."""
        return min(offset for _, offset in self.undo.snapshot.states.values())

    def rewind(self, cache: list, offset: int, drop: int) -> Optional["LastVerify"]:
        """Drop the last `drop` rows of `cache` (now at `offset`); the record of
        what stays, or None, with the cache untouched, when they reach past
        this block or it is not the block the cache ends with."""
        if not 0 < drop <= self.rows or self.start + self.rows != offset:
            return None
        self.target.rollback(cache, self.undo, self.rows - drop)
        return LastVerify(self.target, self.undo.kept(self.rows - drop))


@dataclass(frozen=True)
class CycleOutcome:
    """What one cycle commits: a chain block, a tree path or one plain step."""

    tokens: tuple[int, ...]  # accepted drafts, then the target's own token (cut to max_tokens)
    accepted: int = 0  # drafts accepted
    drafted: int = 0  # draft positions verified (B - 1, a tree's depth); 0 for a plain step
    verify_rows: int = 1  # rows the target ran
    features: Optional[mx.array] = None  # [1, n, F] of the rows now in the target cache, for the drafter
    undo: Optional[LastVerify] = None  # for a recurrent target: how to cut into this block later
    logprobs: Optional[tuple] = None  # a rows.TokenLogprobs per token, when asked for

    def step(self) -> DecodeStep:
        flags = ((True,) * self.accepted + (False,))[: len(self.tokens)]
        return DecodeStep(self.tokens, flags, self.drafted, self.accepted, self.verify_rows, self.logprobs)


@dataclass(frozen=True)
class DecodePlan:
    """One run's settled settings, made by `engine.plan.plan` from a `DecodeRequest` (a plan
    holds a fresh grammar state: one per run); both decode loops take it whole."""

    request: DecodeRequest
    max_tokens: int  # the request's, capped where the context ends
    block: int  # the fixed block, or the most auto may draft (1: plain decoding)
    auto: bool  # `block_size="auto"` picks each cycle's block
    policy: object  # chooses each cycle's block: a `BlockPolicy` or a `FixedBlock`
    tree_rows: int  # rows per verify tree; 0: the chain
    batch_decides: bool  # in a batch, the batch policy picks this sequence's block each cycle
    grammar: Optional[GrammarState]
    rule: Optional[RowRule]  # None: the target's rows are decoded as they are
    # A sampled tree's shape per cycle, the tree or the chain of its rows (tree/shape.py); None: the tree.
    shape: object = None

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    @property
    def prefill_step_size(self) -> Optional[int]:
        return self.request.prefill_step_size


@dataclass(frozen=True)
class Choice:
    """A block size for the next cycle (1: a plain step); policies may say more."""

    block: int


class FixedBlock:
    """The block policy of a fixed block size: the same block every cycle (1:
    plain steps), never drafting past the tokens still wanted."""

    def __init__(self, block_size: int):
        self.block_size = block_size

    def choose(self, tokens_left: int, context: Optional[int] = None) -> Choice:
        return Choice(1 if self.block_size == 1 else max(2, min(self.block_size, tokens_left + 1)))

    def record(self, choice: Choice) -> None:
        pass

    def observe(self, drafted: int, accepted: int) -> None:
        pass


@dataclass
class DecodeCache:
    """Target and drafter caches that persist across calls (multi-turn chat).

    At rest the target cache holds every committed token except the last one,
    which the next call must pass as the first token of its prompt. The drafter
    cache may lag it: the target features of the rows it has not read wait in
    `unread` (drafter offset + unread rows = target offset), because running
    plain-decoded rows through the drafter is a pass nobody needs unless
    someone drafts from them. `catch_up` runs them in; whatever continues or
    stores the drafter cache does that first.
    """

    target: list
    drafter: Optional[list] = None
    tokens: list[int] = field(default_factory=list)
    # True when the caches hold rows past `tokens` that could not be rewound.
    stale: bool = False
    # The last verify block of a recurrent target, so `truncate` can rewind into it.
    last_verify: Optional[LastVerify] = None
    # Target features [1, n, F] of the last n target rows the drafter cache has not read.
    unread: Optional[mx.array] = None

    @property
    def offset(self) -> int:
        return self.target[0].offset if self.target else 0

    @property
    def drafter_rows(self) -> int:
        """Rows the drafter holds or has waiting in `unread` (the target's offset at rest)."""
        if not self.drafter:
            return 0
        return self.drafter[0].offset + (0 if self.unread is None else self.unread.shape[1])

    @property
    def at_rest(self) -> bool:
        """Both caches hold every committed token but the last, the drafter's unread rows
        counted: the state a continuing call relies on (anything else is not reused)."""
        if self.stale or not self.tokens:
            return False
        want = len(self.tokens) - 1
        unread = 0 if self.unread is None else self.unread.shape[1]
        for layers, rows in ((self.target, want), (self.drafter, want - unread)):
            for c in layers or []:
                if getattr(c, "offset", rows) != rows:
                    return False
        return True

    def hold_unread(self, features: Optional[mx.array]) -> None:
        """Keep `features` [1, n, F] (of the rows just after the unread ones) for the drafter
        (lazy: whoever holds it evaluates it, so it keeps no pass's graph)."""
        if features is not None:
            self.unread = features if self.unread is None else mx.concatenate([self.unread, features], axis=1)

    def cut_unread(self, rows: int) -> None:
        """Forget the unread rows past the first `rows` rows of the context."""
        if self.unread is not None:
            read = self.drafter[0].offset
            self.unread = self.unread[:, : rows - read] if rows > read else None

    def catch_up(self, drafter) -> None:
        """Run the unread rows into the drafter cache (and wait for them)."""
        features, self.unread = self.unread, None
        if features is not None and drafter is not None:
            drafter.append_context(features, self.drafter)
            mx.eval([c.state for c in self.drafter])

    def check_continuation(self, prompt: mx.array) -> None:
        """Raise unless `prompt` can continue from this cache."""
        if self.stale:
            raise DFlashError(
                "this prompt cache could not be rewound after the last answer (recurrent state): "
                "make a new one and prefill the conversation again"
            )
        if self.tokens and prompt[0].item() != self.tokens[-1]:
            raise DFlashError(
                "a continuing prompt must start with the cache's last committed token "
                f"({self.tokens[-1]}), then the new tokens"
            )

    def record_prompt(self, prompt: mx.array) -> None:
        """Record a prefilled prompt. A continuing prompt starts with the cache's
        last token (committed, not yet run): it is recorded once."""
        self.tokens.extend(prompt.tolist()[1 if self.tokens else 0 :])
        self.last_verify = None

    def commit(self, tokens: tuple[int, ...], last_verify: Optional[LastVerify] = None) -> None:
        """Record a cycle's tokens; `last_verify` is its undo record (None: the
        caches end with rows that trim, or with a plain step)."""
        self.tokens.extend(tokens)
        self.last_verify = last_verify

    def truncate(self, n_tokens: int) -> None:
        """Forget committed tokens past the first `n_tokens` (an EOS or stop
        string ended the answer inside a verified block, or the caller broke
        off), keeping the at-rest invariant."""
        if len(self.tokens) <= n_tokens:
            return
        del self.tokens[n_tokens:]
        keep = max(n_tokens - 1, 0)
        self.cut_unread(keep)  # the last rows: cut there first, the drafter's own rows after
        if self.last_verify is not None and not can_trim_prompt_cache(self.target):
            # Recurrent layers: replay the rows of the last verified block that stay
            # (nothing happens when the cut is not inside that block).
            rewound = self.last_verify.rewind(self.target, self.offset, self.offset - keep)
            self.last_verify = rewound or self.last_verify
        for caches in (self.target, self.drafter):
            if caches:
                excess = caches[0].offset - keep
                if excess > 0:
                    # Recurrent state cannot be rewound past its last verified
                    # block, and a window cache only by about one block:
                    # callers must re-prefill before continuing.
                    if not can_trim_prompt_cache(caches):
                        self.stale = True
                        return
                    try:
                        trim_prompt_cache(caches, excess)
                    except ValueError:
                        self.stale = True
                        return


class PendingFeatures:
    """Target features [1, n, F] of committed rows not yet in the drafter cache.

    The drafter takes them with its next draft; long plain runs push them in
    every `FLUSH_ROWS` rows. At rest: target cache = committed tokens - 1 =
    drafter cache + pending rows.
    """

    def __init__(self):
        self._chunks: list[mx.array] = []
        self.rows = 0  # counted as they come, not summed per token

    @classmethod
    def taking_over(cls, cache: DecodeCache) -> "PendingFeatures":
        """The rows `cache` holds unread (a prompt's, an earlier run's) as the first pending ones."""
        pending = cls()
        pending.add(cache.unread)
        cache.unread = None
        return pending

    def add(self, features: Optional[mx.array]) -> None:
        if features is not None:
            self._chunks.append(features)
            self.rows += features.shape[1]

    def take(self) -> Optional[mx.array]:
        """All pending rows as one array (None when there are none), now owned by the caller."""
        chunks, self._chunks, self.rows = self._chunks, [], 0
        if not chunks:
            return None
        return chunks[0] if len(chunks) == 1 else mx.concatenate(chunks, axis=1)

    def leave_unread(self, cache: DecodeCache) -> None:
        """At the end of a run: the pending rows wait in `cache.unread` (nothing runs now)."""
        cache.hold_unread(self.take())
        if cache.unread is not None:
            mx.async_eval(cache.unread)  # one buffer of its own, not the passes' it was cut from

    def flush(self, drafter, cache: DecodeCache) -> None:
        """Push the pending rows into the drafter cache."""
        features = self.take()
        if features is None:
            return
        drafter.append_context(features, cache.drafter)
        mx.async_eval([c.state for c in cache.drafter])
