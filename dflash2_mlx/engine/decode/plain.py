"""Plain decoding: one token per target pass, written once.

`--ar`, the plain steps of `--block-size auto` and the calibration's plain
measurement all run `PlainStep`, with mlx-lm's look-ahead: the loop launches
the next step before it fetches the current token, so the device never waits
for Python. When the pair has a drafter, each step also captures the
drafter's target layers (references to activations the pass computes anyway),
so the rows decoded plainly reach the drafter cache before the next draft.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx

from ..pair import Pair
from ..target.adapter import Undo
from .profile import CycleProfiler
from .rows import RowRule
from .state import CycleOutcome, DecodeCache


@dataclass(frozen=True)
class PlainStep:
    """A launched one-token target pass whose token is not fetched yet."""

    token: mx.array  # the sampled next token (lazy)
    features: Optional[mx.array] = None  # [1, 1, F] of the row this pass ran (None: no drafter)
    undo: Optional[Undo] = None  # how to take the row back out of the target cache
    rows: int = 1  # target rows run; 0 for the prefill's first token
    row: Optional[mx.array] = None  # the decoded row [V], when log-probabilities are reported
    rule: Optional[RowRule] = None

    @classmethod
    def launch(cls, pair: Pair, cache: DecodeCache, token: mx.array, sample: Callable, key,
               rule: Optional[RowRule] = None) -> "PlainStep":
        """Run `token` through the target and start sampling what follows it
        (`rule`, when it reads the tokens, needs `token` committed in `cache`)."""
        logits, features, undo = pair.target.forward_undoable(token.reshape(1, 1), cache.target, pair.layer_ids)
        return cls.sampled(logits[0, -1], cache, sample, key, rule, features=features, undo=undo)

    @classmethod
    def sampled(cls, row: mx.array, cache: DecodeCache, sample: Callable, key, rule: Optional[RowRule],
                **fields) -> "PlainStep":
        """The step that samples from target row [V] after the tokens committed in `cache`."""
        if rule is not None:
            row = rule.plain(row, cache.tokens)
        y = sample(row, key)
        # The captured features are evaluated with the token, not left lazy until the drafter
        # takes them: a lazy array keeps the pass's graph, with it the KV arrays before this
        # row's write, and then the next step's in-place write into each cache up to the last
        # tapped layer cannot reuse its buffer and copies the whole cache (at 16,384 tokens
        # that was +11 % instructions per plain step against --ar).
        features = fields.get("features")
        mx.async_eval([y] if features is None else [y, features])
        keep = rule if rule is not None and rule.top_logprobs is not None else None
        return cls(y, row=row if keep else None, rule=keep, **fields)

    def finish(self, profiler: CycleProfiler) -> CycleOutcome:
        """Fetch the token: the step's one host sync (the prefill's is not a decode pass)."""
        token = profiler.fetch(self.token, "plain") if self.rows else self.token.item()
        logprobs = self.rule.logprobs(self.row[None], [token]) if self.rule is not None else None
        return CycleOutcome((token,), verify_rows=self.rows, features=self.features, logprobs=logprobs)

    def cancel(self, pair: Pair, cache: DecodeCache) -> None:
        """Undo a look-ahead that will not be committed (the loop was closed)."""
        if self.undo is not None:
            pair.target.rollback(cache.target, self.undo, keep=0)
