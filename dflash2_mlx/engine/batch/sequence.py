"""One sequence of a batch: a `SequenceRun` (the cycle order both loops share)
whose prompt runs chunk by chunk beside the other sequences' cycles.

Its own caches (a `DecodeCache`, so a prompt cache continues it and takes it
back), its plan (sampling, rows' rule, grammar, block policy, tokens left) and
its PRNG key chain are the run's; this adds only what a batch needs: the
chunked prefill, the most sequences it ran beside, and leaving early.
"""

from typing import Optional

from ..decode.loop import prefill_chunks
from ..decode.sequence import SequenceRun
from ..decode.state import CycleOutcome, DecodeCache, DecodePlan, DecodeStep
from ..pair import Pair


class BatchSequence(SequenceRun):
    """A sequence in a `BatchDecoder` (made by `BatchDecoder.add`)."""

    def __init__(self, pair: Pair, prompt, plan: DecodePlan, prompt_cache: Optional[DecodeCache] = None):
        super().__init__(pair, prompt, plan, prompt_cache)
        self.block = plan.block
        self.closed = False
        self.largest_batch = 0  # the most sequences a pass of this one ran beside (itself included)
        self._chunks = prefill_chunks(self.prompt, pair, self.cache, plan.prefill_step_size)

    @property
    def finished(self) -> bool:
        return self.closed or super().finished

    @property
    def running(self) -> bool:
        """Prefilled and still decoding."""
        return self.anchor is not None and not self.finished

    def prefill_chunk(self) -> Optional[DecodeStep]:
        """Run the next prompt chunk; after the last, the first token's step."""
        try:
            next(self._chunks)
            return None
        except StopIteration as done:
            last = done.value
        self.prefilled()
        row = last if self.rule is None else self.rule.plain(last, self.cache.tokens)
        token = self.sample(row, self.prefill_key).item()
        logprobs = None
        if self.rule is not None and self.rule.top_logprobs is not None:
            logprobs = self.rule.logprobs(row[None], [token])
        outcome = CycleOutcome((token,), verify_rows=0, logprobs=logprobs)
        self.decide_before_commit()
        self.commit(outcome, plain=True, decided=True)
        return outcome.step()

    def acceptance(self):
        """Its policy's acceptance estimate at its context (the batch policy reads it)."""
        self.policy.use_context(self.context)
        return self.policy.acceptance

    def close(self) -> None:
        """Leave the caches at rest, as the loop does when closed."""
        self.closed = True
        self._chunks.close()
        super().close()
