"""The distribution each target row is decoded from.

Raw logits, then mlx-lm's logits processors (`sample_utils.make_logits_processors`:
logit bias, repetition / presence / frequency penalties) given that row's own
prefix, then the grammar's mask. One rule for plain steps and for every row of
a verified block (row t's prefix is the committed tokens and the first t
drafts), so speculation decodes exactly what penalised, constrained plain
decoding decodes: acceptance and the residual read the processed rows.

It also reports log-probabilities as mlx-lm's server does: the log-softmax of
the processed row (before temperature and the sampling filters) at the
committed token, and the row's most likely tokens.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import mlx.core as mx

from ..grammar import GrammarState, masked


@dataclass(frozen=True)
class TokenLogprobs:
    """A committed token's log-probability and its row's `top` (token, log-probability) pairs."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class RowRule:
    """`processors`: mlx-lm logits processors (tokens [L], logits [1, V]) -> logits;
    `grammar`: the constraint; `top_logprobs`: None reports nothing, k >= 0 reports
    each committed token's log-probability and its row's k most likely tokens."""

    def __init__(self, processors: Sequence[Callable] = (), grammar: Optional[GrammarState] = None,
                 top_logprobs: Optional[int] = None):
        self.processors, self.grammar, self.top_logprobs = tuple(processors), grammar, top_logprobs

    @property
    def needs_tokens(self) -> bool:
        """A row depends on the token before it: a plain step cannot launch ahead of it."""
        return bool(self.processors) or self.grammar is not None

    def plain(self, row: mx.array, tokens: Sequence[int]) -> mx.array:
        """One row [V] after the committed `tokens`."""
        if self.processors:
            history = mx.array(list(tokens), dtype=mx.int32)
            row = self._process(history, row[None])[0]
        if self.grammar is not None:
            row = masked(row, self.grammar.allowed())
        return row

    def block(self, rows: mx.array, tokens: Sequence[int], draft: mx.array, masks=None) -> mx.array:
        """Verified rows [n+1, V] after `tokens`: row t follows the first t of `draft`;
        `masks` [n+1, V] is the grammar's for each row (constrained.grammar_propose)."""
        if self.processors:
            history = mx.concatenate([mx.array(list(tokens), dtype=mx.int32), draft.astype(mx.int32)])
            base = len(tokens)
            rows = mx.concatenate([self._process(history[: base + t], rows[t : t + 1])
                                   for t in range(rows.shape[0])], axis=0)
        return rows if masks is None else masked(rows, masks)

    def tree(self, rows: mx.array, tokens: Sequence[int], paths: Sequence[tuple], masks=None) -> mx.array:
        """A draft tree's node rows [N, V] after `tokens`: node j follows its drafted
        tokens `paths[j]`; `masks` [N, V] the grammar's for each node."""
        if self.processors:
            rows = mx.concatenate([self._process(mx.array(list(tokens) + list(path), dtype=mx.int32), rows[j : j + 1])
                                   for j, path in enumerate(paths)], axis=0)
        return rows if masks is None else masked(rows, masks)

    def _process(self, history: mx.array, logits: mx.array) -> mx.array:
        for processor in self.processors:
            logits = processor(history, logits)
        return logits

    def logprobs(self, rows: mx.array, chosen: Sequence[int]) -> Optional[tuple[TokenLogprobs, ...]]:
        """For each chosen token, its row's log-softmax there (rows[i] for chosen[i])."""
        if self.top_logprobs is None or not chosen:
            return None
        n = len(chosen)
        lp = rows[:n].astype(mx.float32)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        picked = mx.take_along_axis(lp, mx.array(list(chosen))[:, None], axis=-1)[:, 0]
        k = min(self.top_logprobs, lp.shape[-1])
        if k > 0:
            top_ids = mx.argsort(-lp, axis=-1)[:, :k]
            top_lp = mx.take_along_axis(lp, top_ids, axis=-1)
            ids, vals, picks = top_ids.tolist(), top_lp.tolist(), picked.tolist()
            # A token the row rules out (-inf: a grammar's mask) is not among the likely ones.
            return tuple(TokenLogprobs(p, tuple((t, x) for t, x in zip(i, v) if x > -math.inf))
                         for p, i, v in zip(picks, ids, vals))
        return tuple(TokenLogprobs(p) for p in picked.tolist())
