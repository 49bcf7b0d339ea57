"""One chain cycle: draft a block, walk it to one path, verify the path in one
target pass, accept a prefix, roll the rest back (docs/algorithm.md §5–§6)."""

from typing import Callable, Optional

import mlx.core as mx

from ..drafter.propose import propose
from ..pair import Pair
from ..sampling import SamplingParams
from .constrained import grammar_propose
from .profile import CycleProfiler
from .rows import RowRule
from .state import CycleOutcome, DecodeCache, LastVerify
from .verify import accept_greedy, accept_sampled


def chain_cycle(pair: Pair, cache: DecodeCache, anchor: int, pending: Optional[mx.array], keys: tuple,
                rule: Optional[RowRule] = None, *, block: int, sampling: SamplingParams,
                transform: Callable, left: int, profiler: CycleProfiler) -> CycleOutcome:
    """Draft `block - 1` tokens after `anchor`, verify them, commit at most `left`.

    `pending`: features of committed rows the drafter has not seen (it takes
    them into its cache now); `keys`: (draft, accept) PRNG keys, None when greedy.
    `rule` (rows.py): what each verified row's distribution is (logits processors
    with the row's own prefix, the grammar's mask); under a grammar the draft
    holds only what it allows (constrained.py).
    """
    target, drafter = pair.target, pair.drafter
    k_draft, k_accept = keys
    profiler.start()
    ids = mx.array([[anchor] + [pair.mask_token_id] * (block - 1)], dtype=mx.int32)
    hidden, draft_logits = drafter.draft(ids, pending, cache.drafter, target)
    profiler.lap("draft", draft_logits)
    masks, grammar = None, rule.grammar if rule is not None else None
    if grammar is None:
        prop = propose(drafter, draft_logits, hidden, anchor, sampling, transform, k_draft, pair.selector_transform)
        # Start the drafter now and build the verify graph while it runs.
        mx.async_eval(prop.draft)
    else:  # the walk runs on the host, beside the grammar
        prop, masks = grammar_propose(drafter, draft_logits, hidden, anchor, sampling, transform, k_draft,
                                      pair.selector_transform, grammar)
    profiler.lap("select", prop.draft)
    verify_in = mx.concatenate([mx.array([anchor], dtype=mx.int32), prop.draft])[None]
    logits, features, undo = target.forward_undoable(verify_in, cache.target, pair.layer_ids)
    profiler.lap("verify", logits, features)
    rows = logits[0] if rule is None else rule.block(logits[0], cache.tokens, prop.draft, masks)
    if sampling.greedy:
        a, bonus = accept_greedy(prop.draft, rows)
    else:
        a, bonus = accept_sampled(prop.draft, prop.q_full, rows, transform, k_accept)
    if features is not None:  # evaluated now, so no lazy graph holds the caches' old buffers (plain.py)
        mx.async_eval(features)
    out = profiler.fetch(mx.concatenate([prop.draft, bonus[None], a[None]]))  # the cycle's one sync
    a, bonus = out[-1], out[-2]
    tokens = tuple(out[:a]) + (bonus,)
    keep = a + 1  # the anchor and the accepted rows: committed tokens but the last
    if len(tokens) > left:  # the last block verified one draft past the limit
        tokens, keep = tokens[:left], left
    target.rollback(cache.target, undo, keep)
    drafted = prop.draft.size
    logprobs = rule.logprobs(rows, tokens) if rule is not None else None
    return CycleOutcome(tokens, accepted=a, drafted=drafted, verify_rows=drafted + 1, logprobs=logprobs,
                        features=features[:, :keep], undo=LastVerify.after_rollback(target, undo, keep))
