"""Continuous batching with speculation: many sequences, one target pass per cycle.

`BatchDecoder.step()` runs one prompt chunk of the oldest joining sequence
(a long prompt never stalls the others for more than a chunk), then one cycle
of every running sequence: each adds its rows to one target pass (its anchor
and drafted block, or one plain row), the drafting ones are drafted together
in one drafter pass, and each then accepts, rolls back and commits on its own
(passes.py, docs/batching.md). Sequences join with `add` and leave with
`remove` between steps. It knows nothing about text: ids in, `DecodeStep`s out.

Each sequence's block is its own policy's (a fixed block, or the seeded
sequence's clock-free schedule) or, for auto sequences, the batch policy's
(`adaptive.batch_policy`): the block of every sequence that maximises the
batch's committed tokens per second at the pass cost of the batch's total rows.
"""

import time
from typing import Optional

import mlx.core as mx

from ...errors import DFlashError
from ..adaptive.batch_policy import SequenceView
from ..decode.verify import accept_greedy, accept_sampled
from ..decode.constrained import grammar_propose
from ..decode.state import CycleOutcome, DecodeCache, DecodePlan, DecodeStep, LastVerify
from ..drafter.propose import propose
from ..pair import Pair
from ..target.adapter import Undo
from ..tree.cycle import PlannedTree, finish_tree, plan_tree
from ..tree.verify import tree_views
from .ahead import LookAhead
from .passes import batch_blocker, draft_pass, target_pass
from .plain_run import PlainRun
from .sequence import BatchSequence

__all__ = ["BatchDecoder", "BatchSequence", "SequenceFailed", "batch_blocker"]


class SequenceFailed(Exception):
    """One sequence's own step raised (`error`) before any other's ran: only it has to
    go; the others' caches are untouched and they run on at the next step."""

    def __init__(self, seq: "BatchSequence", error: Exception):
        super().__init__(str(error))
        self.seq, self.error = seq, error


class BatchDecoder:
    """Runs up to `max_batch` sequences of `pair` together. `policy`: a
    `BatchPolicy` (or None: every sequence follows its own policy)."""

    def __init__(self, pair: Pair, max_batch: int = 8, policy=None):
        why = batch_blocker(pair)
        if why is not None:
            raise DFlashError(f"target '{pair.target.model_type}' cannot batch: {why}")
        if max_batch < 1:
            raise DFlashError(f"max batch {max_batch}: run at least one sequence")
        self.pair, self.max_batch, self.policy = pair, max_batch, policy
        self.sequences: list[BatchSequence] = []
        self.passes = 0  # batched target passes run
        self.last_pass: tuple[int, int] = (0, 0)  # (sequences, rows) of the latest pass
        self.last_blocks: list[int] = []  # each sequence's block in it (1: a plain row)
        self._ahead: Optional[LookAhead] = None  # the next all-plain pass, launched early
        self._run = PlainRun()  # the batch's buffers while passes are one plain row each (plain_run.py)
        self._untimed = 0.0  # seconds of cycles that computed no pass, added to the next pass's time

    # -- joining and leaving ------------------------------------------------------------
    def add(self, prompt, plan: DecodePlan, prompt_cache: Optional[DecodeCache] = None) -> BatchSequence:
        """A new sequence decoding as `plan` says (`engine.plan.plan(..., batched=True)`);
        its prompt runs chunk by chunk in the next steps."""
        if len(self.sequences) >= self.max_batch:
            raise DFlashError(f"the batch is full ({self.max_batch} sequences): remove one first")
        seq = BatchSequence(self.pair, prompt, plan, prompt_cache)
        self.sequences.append(seq)
        return seq

    def remove(self, seq: BatchSequence) -> None:
        """Take `seq` out (finished, stopped by its caller or cancelled); its caches stay at rest."""
        if seq in self.sequences:
            self.sequences.remove(seq)
        if self._ahead is not None:
            self._ahead.drop(seq)
        self._run.clear()  # its caches (a prompt cache may keep them) hold their own rows again
        seq.close()

    @property
    def full(self) -> bool:
        return len(self.sequences) >= self.max_batch

    # -- one step -------------------------------------------------------------------------
    def step(self) -> list[tuple[BatchSequence, DecodeStep]]:
        """One prompt chunk of the oldest joining sequence, then one cycle of
        every running one; the steps they committed. Finished sequences stay
        until removed (`seq.finished`)."""
        out = []
        joining = [s for s in self.sequences if s.anchor is None and not s.finished]
        running = [s for s in self.sequences if s.running]
        if joining:
            try:
                first = joining[0].prefill_chunk()  # its prompt, its first token: its own hooks run here
            except Exception as e:
                raise SequenceFailed(joining[0], e) from e
            if first is not None:
                out.append((joining[0], first))
        if running:
            steps, ran = self._cycle(running)
            out.extend(zip(ran, steps))
        return out

    def _cycle(self, seqs: list[BatchSequence]) -> list[DecodeStep]:
        tic = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.seqs:  # launched last cycle: newcomers join the next one
            seqs, blocks, chosen, keys = ahead.seqs, [1] * len(ahead.seqs), ahead.chosen, ahead.keys
            drafts, passes, picks = [None] * len(seqs), ahead.passes, ahead.picks
            groups = [(None, s.cache.target) for s in seqs]
        else:
            blocks, chosen = self._blocks(seqs)
            blocks = [s.cycle_shape(b)[1] if b > 1 else b for s, b in zip(seqs, blocks)]
            keys = [s.next_keys(b > 1) for s, b in zip(seqs, blocks)]
            drafts = self._draft(seqs, blocks, keys)
            groups = [_group(s, d) for s, d in zip(seqs, drafts)]
            passes = target_pass(self.pair, groups, self._run)
            picks = [None if isinstance(d, PlannedTree) else self._pick(s, d, p[0][0], k)
                     for s, d, p, k in zip(seqs, drafts, passes, keys)]
        for s in seqs:
            s.largest_batch = max(s.largest_batch, len(seqs))
        decided = self._look_ahead(seqs, blocks, picks)
        fetched = _fetch_all([p for p in picks if p is not None], [p[1] for p in passes if p[1] is not None])
        self.passes += 1
        self.last_pass = (len(seqs), sum(1 if t is None else t.size for t, _ in groups))
        steps = []
        for s, d, g, p in zip(seqs, drafts, groups, passes):
            if isinstance(d, PlannedTree):
                outcome = finish_tree(d, s.cache, g[1], p[0][:, 0], None if p[1] is None else p[1][:, 0],
                                      sampling=s.sampling, transform=s.transform, left=s.left, rule=s.rule,
                                      profiler=s.profiler)
            else:
                outcome = self._outcome(s, d, (p[0][0], None if p[1] is None else p[1][:1], g[0]),
                                        fetched.pop(0))
            s.commit(outcome, plain=d is None, decided=decided)
            steps.append(outcome.step())
        self._time_pass(chosen, blocks, time.perf_counter() - tic, from_ahead=ahead is not None and bool(ahead.seqs),
                        launched=self._ahead is not None)
        self.last_blocks = blocks
        return steps, seqs

    def _time_pass(self, chosen: bool, blocks: list[int], seconds: float, from_ahead: bool, launched: bool) -> None:
        """Tell the batch policy what one pass took, when it chose this cycle's blocks.

        A cycle's seconds are not always its own pass's: one that launches the next
        pass computes it too (on the CPU the launch evaluates both, and a GPU's
        look-ahead runs under this cycle's host work), and one that runs a pass
        launched earlier computes nothing of its own. Timed as they come, a
        plain pass looked twice as slow as it is every other cycle (and the
        policy drafted where plain decoding was cheaper): so the cycle's seconds
        are split over the passes it computed, and a cycle that computed none
        adds its seconds to the next."""
        computed = (0 if from_ahead else 1) + (1 if launched else 0)
        if computed == 0:
            self._untimed += seconds
            return
        seconds, self._untimed = (seconds + self._untimed) / computed, 0.0
        if chosen:
            self.policy.observe_pass(self.last_pass[1], sum(b for b in blocks if b > 1), seconds)

    def _look_ahead(self, seqs: list[BatchSequence], blocks: list[int], picks: list) -> bool:
        """After an all-plain cycle, decide the next one now (as the single-sequence loop
        decides before it fetches a plain token) and, when it is all plain too, launch it
        (ahead.py). Returns whether the sequences' own policies have decided already."""
        if any(b != 1 for b in blocks) or any(s.rule is not None or s.grammar is not None for s in seqs):
            return False
        for s in seqs:  # their next cycle, from the tokens left after this one and this context
            s.decide_before_commit()
        if any(s.left <= 1 for s in seqs) or any(s.running and s not in seqs for s in self.sequences):
            return True  # someone finishes, or a newcomer waits to join: the next pass is not this set
        nxt, chosen = self._blocks(seqs, context_ahead=1)
        if any(b != 1 for b in nxt):
            return True
        self._ahead = LookAhead.launch(self.pair, seqs, [p[0] for p in picks], chosen, self._run)
        return True

    def _blocks(self, seqs: list[BatchSequence], context_ahead: int = 0) -> tuple[list[int], bool]:
        """Each sequence's block this cycle (1: a plain row), and whether the batch policy chose them.
        `context_ahead`: decided that many tokens before the cycle's context (a look-ahead)."""
        own = [s.choice.block if s.choice is not None else 1 for s in seqs]
        if self.pair.drafter is None:
            return [1] * len(seqs), False
        free = [i for i, s in enumerate(seqs) if s.plan.batch_decides and s.rule is None and not s.tree_rows]
        if self.policy is None or not free:
            return own, False
        views = [SequenceView(tokens_left=s.left - context_ahead, context=s.context + context_ahead, max_block=s.block,
                              acceptance=s.acceptance(), fixed=None if i in free else own[i])
                 for i, s in enumerate(seqs)]
        return list(self.policy.choose(views)), True

    def _draft(self, seqs, blocks, keys) -> list:
        """Per sequence: None (a plain row), (proposal, grammar masks), or a PlannedTree."""
        idx = [i for i, b in enumerate(blocks) if b > 1]
        out = [None] * len(seqs)
        if not idx:
            return out
        pair = self.pair
        drafted = draft_pass(pair, [seqs[i].anchor for i in idx], [blocks[i] for i in idx],
                             [seqs[i].pending.take() for i in idx], [seqs[i].cache.drafter for i in idx])
        for i, (hidden, logits) in zip(idx, drafted):
            s, (k_draft, k_accept) = seqs[i], keys[i]
            if s.tree_now:
                out[i] = plan_tree(pair, s.anchor, hidden, logits, rows=s.tree_rows, sampling=s.sampling,
                                   key=k_accept, rule=s.rule, profiler=s.profiler)
            elif s.grammar is None:
                out[i] = (propose(pair.drafter, logits, hidden, s.anchor, s.sampling, s.transform, k_draft,
                                  pair.selector_transform), None)
            else:
                out[i] = grammar_propose(pair.drafter, logits, hidden, s.anchor, s.sampling, s.transform, k_draft,
                                         pair.selector_transform, s.grammar)
        return out

    def _pick(self, s: BatchSequence, drafted, logits, keys):
        """The tokens this sequence takes from its rows [n, V] (lazy): (accepted, bonus) or the plain token."""
        if drafted is None:
            row = logits[0] if s.rule is None else s.rule.plain(logits[0], s.cache.tokens)
            return (s.sample(row, keys[0]), row)
        prop, masks = drafted
        rows = logits if s.rule is None else s.rule.block(logits, s.cache.tokens, prop.draft, masks)
        if s.sampling.greedy:
            a, bonus = accept_greedy(prop.draft, rows)
        else:
            a, bonus = accept_sampled(prop.draft, prop.q_full, rows, s.transform, keys[1])
        return (mx.concatenate([prop.draft, bonus[None], a[None]]), rows)

    def _outcome(self, s: BatchSequence, drafted, passed, fetched) -> CycleOutcome:
        """The cycle outcome of one sequence, its rejected rows rolled back (chain.py's rule).
        `passed`: its logits [n, V], features [1, n, F] and rows [1, n]."""
        logits, features, tokens_in = passed
        undo = Undo(tokens_in, None)  # batched targets' caches all trim (passes.batch_blocker)
        values, processed = fetched
        target = self.pair.target
        if drafted is None:  # a plain row: its token, the row kept
            token = values[0]
            logprobs = s.rule.logprobs(processed[None], [token]) if s.rule is not None else None
            return CycleOutcome((token,), verify_rows=1, features=features, logprobs=logprobs)
        a, bonus = values[-1], values[-2]
        tokens = tuple(values[:a]) + (bonus,)
        keep = a + 1
        if len(tokens) > s.left:  # the last block verified one draft past the limit
            tokens, keep = tokens[: s.left], s.left
        target.rollback(s.cache.target, undo, keep)
        n = drafted[0].draft.size
        logprobs = s.rule.logprobs(processed, tokens) if s.rule is not None else None
        return CycleOutcome(tokens, accepted=a, drafted=n, verify_rows=n + 1, logprobs=logprobs,
                            features=None if features is None else features[:, :keep],
                            undo=LastVerify.after_rollback(target, undo, keep))


def _group(s: BatchSequence, drafted) -> tuple:
    """What `s` adds to the target pass: (tokens [rows, n], layer members)."""
    anchor = mx.array([[s.anchor]], dtype=mx.int32)
    if drafted is None:
        return anchor, s.cache.target
    if isinstance(drafted, PlannedTree):
        return mx.array(drafted.tree.tokens, dtype=mx.int32)[:, None], tree_views(s.cache.target, drafted.tree)
    return mx.concatenate([anchor, drafted[0].draft.astype(mx.int32)[None]], axis=1), s.cache.target


def _fetch_all(picks: list, features: list) -> list:
    """Every sequence's picked tokens in one host synchronisation: (values, processed rows).
    (One `eval` of them all, then each read: no new array, so picks a look-ahead has
    computed already cost nothing more.) The pass's `features` are evaluated with them, so
    no lazy array keeps the pass's graph and the caches' old buffers (decode/plain.py)."""
    mx.eval([value for value, _ in picks] + features)
    return [(_ints(value.tolist()), row) for value, row in picks]


def _ints(value) -> list:
    """A read array as a flat list of ints (a 0-d token reads as one int)."""
    return [value] if isinstance(value, int) else list(value)
