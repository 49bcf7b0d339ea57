"""Rewinding a recurrent target into its last verified block, after the fact.

A verify forward through Gated DeltaNet layers is undone by restoring their
state from before it and replaying the rows that stay (`Target.rollback`).
The decode loop does that once per cycle; when an answer then ends inside the
block it just committed (an EOS or a stop string past the first token), the
caller has to drop a few more rows. Attention caches simply trim, but the
recurrent state has already absorbed them. Keeping the cycle's undo record,
cut to the rows that stayed, lets `DecodeCache.truncate` replay a shorter
prefix instead of marking the cache stale (which costs a chat turn a full
re-prefill of the conversation).
"""

from dataclasses import dataclass
from typing import Optional

from ..target.adapter import Target, Undo


@dataclass
class LastVerify:
    target: Target
    undo: Undo  # the last verify forward, cut to the rows the caches kept

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

    def rewind(self, cache: list, offset: int, drop: int) -> bool:
        """Drop the last `drop` rows of `cache` (now at `offset`). False, with the
        cache untouched, when they reach past this block or it is not the
        block the cache ends with."""
        if not 0 < drop <= self.rows or self.start + self.rows != offset:
            return False
        self.target.rollback(cache, self.undo, self.rows - drop)
        self.undo = self.undo.kept(self.rows - drop)
        return True
