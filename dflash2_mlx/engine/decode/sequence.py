"""One sequence's decode state and its cycle order, written once.

Both loops run a sequence through the same order: decide → (draft → verify)
→ commit. A `SequenceRun` holds what a sequence keeps between cycles (its
caches, sampler, rows' rule, PRNG key chain, tokens left, block policy, the
next cycle's choice) and is the only code that says

- how the key chain splits: the prefill's key first, then one key per plain
  step, or (draft, accept) keys per speculative cycle, in cycle order;
- when the next cycle is decided: before a plain step's token is committed
  (from the tokens left after it and the context before it, so the next
  plain step can launch before this token is fetched), after a speculative
  cycle's tokens are committed (from the context after them);
- when the sequence ends: no tokens left, or a grammar that is complete.

The single-sequence loop (loop.py) and the batch decoder (engine/batch/) call
these methods and nothing else to move a sequence on; tests/test_cycle_order.py
drives both through the same scripted schedule.
"""

from typing import Optional

import mlx.core as mx

from ..pair import Pair
from ..sampling import make_key, make_logprobs_transform, split_key, token_sampler
from .profile import CycleProfiler
from .state import FLUSH_ROWS, Choice, CycleOutcome, DecodeCache, DecodePlan, PendingFeatures
from ...errors import DFlashError


class SequenceRun:
    def __init__(self, pair: Pair, prompt, plan: DecodePlan, prompt_cache: Optional[DecodeCache] = None,
                 profiler: Optional[CycleProfiler] = None):
        self.pair, self.plan = pair, plan
        self.prompt = check_prompt(prompt)
        self.cache = cache_for(self.prompt, pair, prompt_cache)
        self.profiler = profiler or CycleProfiler()
        self.sampling = plan.sampling
        self.transform = make_logprobs_transform(self.sampling)
        self.sample = token_sampler(self.sampling, self.transform)
        self.rule, self.grammar, self.policy = plan.rule, plan.grammar, plan.policy
        self.tree_rows = plan.tree_rows
        self.tree_now = False  # the drafted cycle under way verifies a tree
        self.key, self.prefill_key = split_key(make_key(self.sampling))
        self.pending = PendingFeatures()  # the prompt's rows join when its prefill ends
        self.left = plan.max_tokens
        self.anchor: Optional[int] = None  # the last committed token (None until the prefill's)
        self.choice: Optional[Choice] = None  # the next cycle's block, once decided
        self._prefilled = False

    @property
    def context(self) -> int:
        return len(self.cache.tokens)

    @property
    def finished(self) -> bool:
        return self.left <= 0 or (self.grammar is not None and self.grammar.done)

    def prefilled(self) -> None:
        """The prompt has run: its rows wait for the drafter, its tokens are the cache's."""
        self.pending = PendingFeatures.taking_over(self.cache)
        self.cache.record_prompt(self.prompt)
        self._prefilled = True

    def next_keys(self, drafting: bool) -> tuple:
        """The cycle's PRNG keys from the chain: (draft, accept) when it drafts,
        (plain step's key, None) when it does not."""
        if drafting:
            self.key, k_draft, k_accept = split_key(self.key, 3)
            return k_draft, k_accept
        self.key, sub = split_key(self.key)
        return sub, None

    def cycle_shape(self, block: int) -> tuple[bool, int]:
        """(tree, block) of the next drafted cycle of `block`: a tree request verifies its
        tree or, sampled, the chain of the same rows where that committed more so far
        (the plan's `shape`, engine/tree/shape.py); a chain request its block."""
        self.tree_now = bool(self.tree_rows) and (self.plan.shape is None or self.plan.shape.next_is_tree())
        return self.tree_now, block if self.tree_now or not self.tree_rows else min(self.tree_rows, block)

    def decide_before_commit(self) -> Optional[Choice]:
        """A plain step's token is not committed yet: decide what follows it now
        (tokens left after it, the context before it)."""
        self.choice = decide(self.policy, self.left - 1, self.context)
        return self.choice

    def commit(self, outcome: CycleOutcome, plain: bool, decided: bool = False) -> None:
        """The one commit tail: tokens and undo record into the cache (and the grammar),
        features towards the drafter, the outcome to the policy; then, unless it was
        decided before the commit (`decided`), the next cycle. `plain`: the outcome of a
        plain step (the prefill's token included), not of a drafted block."""
        context = self.context
        drafter = self.pair.drafter
        self.cache.commit(outcome.tokens, outcome.undo)
        if self.grammar is not None:
            self.grammar.advance(outcome.tokens)
        self.pending.add(outcome.features)
        if drafter is not None and self.pending.rows >= FLUSH_ROWS:
            self.pending.flush(drafter, self.cache)
        if outcome.drafted:
            self.policy.observe(outcome.drafted, outcome.accepted)
            if self.plan.shape is not None:
                self.plan.shape.observe(self.tree_now, len(outcome.tokens))
        self.left -= len(outcome.tokens)
        self.anchor = outcome.tokens[-1]
        if not decided:  # a plain step decides from the context before it (as decide_before_commit)
            self.choice = decide(self.policy, self.left, context if plain else self.context)
        if self.finished:
            self.choice = None

    @property
    def plain_next(self) -> bool:
        """The next cycle is a plain step."""
        return self.choice is not None and self.choice.block == 1

    def close(self) -> None:
        """Leave the caches at rest: the target cache holds every committed token but
        the last; the rows the drafter has not read wait in the cache (a later call
        catches it up first)."""
        if self.pair.drafter is not None and self._prefilled:  # before it, the cache holds its own rows
            self.pending.leave_unread(self.cache)


def decide(policy, tokens_left: int, context: int) -> Optional[Choice]:
    """The policy's choice for the next cycle, acted on; None when no tokens are left.
    `context`: the tokens committed so far (a cycle reads them all: its cost grows with them)."""
    if tokens_left <= 0:
        return None
    choice = policy.choose(tokens_left, context)
    policy.record(choice)
    return choice


def cache_for(prompt: mx.array, pair: Pair, prompt_cache: Optional[DecodeCache]) -> DecodeCache:
    """`prompt_cache`, checked to continue with `prompt`; else fresh caches."""
    if prompt_cache is not None:
        prompt_cache.check_continuation(prompt)
        return prompt_cache
    drafter = pair.drafter
    return DecodeCache(pair.target.make_cache(), drafter.make_cache() if drafter else None)


def check_prompt(prompt) -> mx.array:
    prompt = mx.array(prompt, dtype=mx.int32).reshape(-1)
    if prompt.size == 0:
        raise DFlashError("the prompt is empty: give some text to continue")
    return prompt
