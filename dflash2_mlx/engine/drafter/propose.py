"""Turn the drafter's block hidden states into draft tokens and proposals.

DFlash (v1) picks each position independently from its own logits; DFlash 2
walks the candidate lattices with the selector (docs/algorithm.md §3, §4). Either way the
result is the draft and, when sampling, the proposal distribution each draft
token was drawn from, which exact rejection sampling needs.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx

from .model import Drafter
from ..sampling import SamplingParams, greedy_token
from ..logit_transform import LogitTransform, apply_logit_transform
from .selector import path_select, top_k_candidates


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
    selector_transform: LogitTransform,
) -> Proposal:
    """draft_logits [B-1, V] from the target head, hidden [B-1, H] final-normed.

    `selector_transform` is what the selector still applies to those logits
    (`Pair.selector_transform`).
    """
    if drafter.is_dflash2:
        return _walk_selector(drafter, draft_logits, hidden, anchor, sampling, key, selector_transform)
    if sampling.greedy:
        return Proposal(greedy_token(draft_logits), None)
    logq = transform(draft_logits)
    draft = mx.random.categorical(logq, axis=-1, key=key).astype(mx.int32)
    return Proposal(draft, mx.softmax(logq, axis=-1, precise=True))


def selector_inputs(drafter: Drafter, draft_logits: mx.array, hidden: mx.array, anchor: int,
                    selector_transform: LogitTransform):
    """Unary scores, candidates, predecessor ids and gate for the lattices."""
    K = drafter.config.selector_top_k
    values, cand = top_k_candidates(draft_logits, K)
    unary = apply_logit_transform(values, selector_transform)
    anchor_row = mx.full((1, K), anchor, dtype=mx.int32)
    pred = mx.concatenate([anchor_row, cand[:-1]], axis=0)
    gate = drafter.candidate_selector.hidden_projection(hidden)
    return unary, cand, pred, gate


def _walk_selector(drafter, draft_logits, hidden, anchor, sampling, key, selector_transform) -> Proposal:
    unary, cand, pred, gate = selector_inputs(drafter, draft_logits, hidden, anchor, selector_transform)
    pred_rows, cand_rows, pred_codebook, succ_codebook = drafter.candidate_selector.codebook_rows(pred, cand)
    uniforms = None
    if not sampling.greedy:
        uniforms = mx.random.uniform(shape=(cand.shape[0],), key=key)
    picks, q_rows = path_select(
        unary, pred_rows, cand_rows, gate, pred_codebook, succ_codebook, sampling.temperature, uniforms
    )
    draft = mx.take_along_axis(cand, picks[:, None], axis=-1)[:, 0]
    if sampling.greedy:
        return Proposal(draft, None)
    V = draft_logits.shape[-1]
    q_full = mx.put_along_axis(mx.zeros((cand.shape[0], V), mx.float32), cand, q_rows, axis=-1)
    return Proposal(draft, q_full)
