"""The next plain pass, launched before this one's tokens are fetched.

As mlx-lm's generate loop and the single-sequence loop (decode/plain.py) do:
when every sequence of a cycle runs a plain row and each will run a plain row
next, the next pass is built on this pass's sampled tokens (still lazy) and
started before the host waits for them, so the device never waits for Python.
Its rows are already in the sequences' caches; a sequence that leaves before
that pass is used takes its row back out and its PRNG key back, so what it
decodes never depends on the look-ahead.
"""

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from .passes import target_pass


@dataclass
class LookAhead:
    seqs: list  # the sequences the pass runs, in its order
    picks: list  # per sequence: (its sampled next token (lazy), the row it came from)
    passes: list  # per sequence: (logits [1, 1, V], features [1, 1, F] or None)
    keys: list  # per sequence: the cycle's keys (sub, None)
    previous: list  # per sequence: its PRNG key before the launch split it
    chosen: bool  # whether the batch policy chose these plain rows

    @classmethod
    def launch(cls, pair, seqs: list, tokens: list, chosen: bool, run=None) -> "LookAhead":
        """Run each sequence's lazy `tokens[i]` as its next plain row and sample what follows
        (`run`: the decoder's buffers for plain passes, plain_run.py)."""
        previous = [s.key for s in seqs]
        keys = [s.next_keys(False) for s in seqs]
        passes = target_pass(pair, [(t.reshape(1, 1).astype(mx.int32), s.cache.target) for s, t in zip(seqs, tokens)],
                             run)
        picks = [(s.sample(p[0][0, 0], k[0]), p[0][0, 0]) for s, p, k in zip(seqs, passes, keys)]
        # The features with the tokens: a lazy one would hold the pass's graph (decode/plain.py).
        mx.async_eval([p[0] for p in picks] + [f for _, f in passes if f is not None])
        return cls(list(seqs), picks, passes, keys, previous, chosen)

    def drop(self, seq) -> None:
        """`seq` leaves before the pass is used: its row out of its caches, its key back."""
        if seq not in self.seqs:
            return
        i = self.seqs.index(seq)
        trim_prompt_cache(seq.cache.target, 1)
        seq.key = self.previous[i]
        for column in (self.seqs, self.picks, self.passes, self.keys, self.previous):
            del column[i]

    def cancel(self) -> None:
        for seq in list(self.seqs):
            self.drop(seq)
