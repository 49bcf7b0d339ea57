"""Turn the drafter's block hidden states into draft tokens and proposals.

DFlash (v1) picks each position independently from its own logits; DFlash 2
walks the candidate lattices with the selector (spec §2.2). Either way the
result is the draft and, when sampling, the proposal distribution each draft
token was drawn from, which exact rejection sampling needs.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx

from .drafter import Drafter
from .sampling import SamplingParams, greedy_token
from .selector import path_select, top_k_candidates, transform_unary


@dataclass(frozen=True)
class Proposal:
    draft: mx.array  # [B-1] int32
    q_full: Optional[mx.array]  # [B-1, V] proposal rows; None when greedy


def propose(
    drafter: Drafter,
    draft_logits: mx.array,
    hidden: mx.array,
    anchor: int,
    sampling: SamplingParams,
    transform: Callable[[mx.array], mx.array],
    key: mx.array,
    unary: Optional[tuple[float, Optional[float]]] = None,
) -> Proposal:
    """draft_logits [B-1, V] from the target head, hidden [B-1, H] final-normed.

    `unary` is the (output multiplier, softcap) still to apply to those logits
    for the selector (`compat.unary_transform`); default: the drafter config's.
    """
    if drafter.is_dflash2:
        return _walk_selector(drafter, draft_logits, hidden, anchor, sampling, key, unary)
    if sampling.greedy:
        return Proposal(greedy_token(draft_logits), None)
    logq = transform(draft_logits)
    draft = mx.random.categorical(logq, axis=-1, key=key).astype(mx.int32)
    return Proposal(draft, mx.softmax(logq, axis=-1, precise=True))


def selector_inputs(drafter: Drafter, draft_logits: mx.array, hidden: mx.array, anchor: int, unary=None):
    """Unary scores, candidates, predecessor ids and gate for the lattices."""
    config = drafter.config
    K = config.selector_top_k
    values, cand = top_k_candidates(draft_logits, K)
    multiplier, softcap = unary or (config.output_multiplier, config.final_logit_softcapping)
    unary = transform_unary(values, multiplier, softcap)
    anchor_row = mx.full((1, K), anchor, dtype=mx.int32)
    pred = mx.concatenate([anchor_row, cand[:-1]], axis=0)
    gate = drafter.candidate_selector.hidden_projection(hidden)
    return unary, cand, pred, gate


def _walk_selector(drafter, draft_logits, hidden, anchor, sampling, key, unary) -> Proposal:
    unary, cand, pred, gate = selector_inputs(drafter, draft_logits, hidden, anchor, unary)
    pred_rows, cand_rows, A, Bk = drafter.candidate_selector.codebook_rows(pred, cand)
    uniforms = None
    if not sampling.greedy:
        uniforms = mx.random.uniform(shape=(cand.shape[0],), key=key)
    picks, q_rows = path_select(
        unary, pred_rows, cand_rows, gate, A, Bk, sampling.temperature, uniforms
    )
    draft = mx.take_along_axis(cand, picks[:, None], axis=-1)[:, 0]
    if sampling.greedy:
        return Proposal(draft, None)
    V = draft_logits.shape[-1]
    q_full = mx.put_along_axis(mx.zeros((cand.shape[0], V), mx.float32), cand, q_rows, axis=-1)
    return Proposal(draft, q_full)
