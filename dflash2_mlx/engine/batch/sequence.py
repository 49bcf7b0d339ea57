"""One sequence of a batch: what `generate_step` keeps for a single sequence.

Its own caches (a `DecodeCache`, so a prompt cache continues it and takes it
back), its own sampling, PRNG key chain, rows rule, grammar, tokens left and
block policy. The batch decoder runs its prefill chunk by chunk and its cycles
beside the others'; every rule of a cycle is the single-sequence loop's.
"""

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


from ..decode.loop import cache_for, check_prompt, commit_outcome, decide, prefill_chunks, row_rule
from ..decode.profile import CycleProfiler
from ..decode.state import DecodeCache, DecodeStep, FixedBlock, PendingFeatures
from ..grammar import GrammarState
from ..pair import Pair
from ..sampling import SamplingParams, make_key, make_logprobs_transform, split_key, token_sampler
from ..tree.cycle import tree_rows_for


@dataclass(frozen=True)
class SequenceSettings:
    """What one request asks of its sequence (`generate_step`'s keywords)."""

    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    block_size: Optional[int] = None  # a fixed block (anchor included); None: the drafter's
    # The sequence's own block policy (e.g. a clock-free `BlockPolicy`); None: the fixed block.
    policy: object = None
    # Whether the batch policy may pick this sequence's block each cycle (auto, and no
    # seeded sampling: a seeded schedule must not depend on who else is in the batch).
    batch_decides: bool = False
    grammar: Optional[GrammarState] = None
    logits_processors: Sequence[Callable] = ()
    top_logprobs: Optional[int] = None
    prefill_step_size: Optional[int] = None
    tree_rows: int = 0  # > 0: verify trees of this many rows (docs/tree.md), at the fixed block


class BatchSequence:
    """A sequence in a `BatchDecoder` (made by `BatchDecoder.add`)."""

    def __init__(self, pair: Pair, prompt, settings: SequenceSettings, prompt_cache: Optional[DecodeCache] = None):
        self.pair, self.settings = pair, settings
        self.prompt = check_prompt(prompt)
        self.cache = cache_for(self.prompt, pair, prompt_cache)
        self.block = pair.block_size(settings.block_size)
        self.tree_rows = tree_rows_for(pair, settings.tree_rows) if pair.drafter is not None else 0
        # As the single-sequence loop: a tree drafts the fixed block (the cost model is the chain's).
        self.policy = settings.policy if settings.policy is not None and not self.tree_rows else FixedBlock(self.block)
        self.profiler = CycleProfiler()
        self.sampling = settings.sampling
        self.transform = make_logprobs_transform(self.sampling)
        self.sample = token_sampler(self.sampling, self.transform)
        self.rule = row_rule(settings.grammar, tuple(settings.logits_processors), settings.top_logprobs)
        self.grammar = settings.grammar
        self.key, self._prefill_key = split_key(make_key(self.sampling))
        self.pending = PendingFeatures()  # its prompt's rows join when its prefill ends
        self.left = settings.max_tokens
        self.anchor: Optional[int] = None
        self.choice = None  # the next cycle's block, decided by its own policy (None: the batch's)
        self.finished = False
        self.largest_batch = 0  # the most sequences a pass of this one ran beside (itself included)
        self._chunks = prefill_chunks(self.prompt, pair, self.cache, settings.prefill_step_size)

    @property
    def running(self) -> bool:
        """Prefilled and still decoding."""
        return self.anchor is not None and not self.finished

    @property
    def context(self) -> int:
        return len(self.cache.tokens)

    def prefill_chunk(self) -> Optional[DecodeStep]:
        """Run the next prompt chunk; after the last, the first token's step."""
        try:
            next(self._chunks)
            return None
        except StopIteration as done:
            last = done.value
        self.pending = PendingFeatures.taking_over(self.cache)
        self.cache.record_prompt(self.prompt)
        row = last if self.rule is None else self.rule.plain(last, self.cache.tokens)
        token = self.sample(row, self._prefill_key).item()
        logprobs = None
        if self.rule is not None and self.rule.top_logprobs is not None:
            logprobs = self.rule.logprobs(row[None], [token])
        # As the single-sequence loop: its policy decides the next cycle before the
        # prefill's token is committed (tokens left after it, the prompt's context).
        self.choice = decide(self.policy, self.left - 1, len(self.cache.tokens))
        self.cache.commit((token,))
        if self.grammar is not None:
            self.grammar.advance((token,))
        self.left -= 1
        self.anchor = token
        self._check_done()
        return DecodeStep((token,), (False,), logprobs=logprobs)

    def commit(self, outcome, plain: bool, decided: bool = False) -> DecodeStep:
        """The loop's commit tail for this sequence's cycle outcome (`plain`: a plain row,
        not a drafted block), then its own next decision (`decided`: made already)."""
        context = len(self.cache.tokens)
        self.left = commit_outcome(outcome, self.cache, self.pending, self.policy, self.pair.drafter, self.left,
                                   self.grammar)
        self.anchor = outcome.tokens[-1]
        # The single-sequence loop decides after a plain step before committing its
        # token, after a speculative cycle after committing them.
        if not decided:
            self.choice = decide(self.policy, self.left, context if plain else len(self.cache.tokens))
        self._check_done()
        return outcome.step()

    def acceptance(self):
        """Its policy's acceptance estimate at its context (the batch policy reads it)."""
        self.policy.use_context(self.context)
        return self.policy.acceptance

    def _check_done(self) -> None:
        if self.left <= 0 or (self.grammar is not None and self.grammar.done):
            self.finished = True

    def next_keys(self, drafting: bool) -> tuple:
        """The cycle's PRNG keys, split from this sequence's chain as its loop splits them."""
        if drafting:
            self.key, k_draft, k_accept = split_key(self.key, 3)
            return k_draft, k_accept
        self.key, sub = split_key(self.key)
        return sub, None

    def close(self) -> None:
        """Leave the caches at rest (the rows the drafter has not read wait in the
        cache), as the loop does when closed."""
        self.finished = True
        self._chunks.close()
        if self.pair.drafter is not None and self.anchor is not None:
            self.pending.leave_unread(self.cache)
