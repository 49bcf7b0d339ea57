"""Drafting under a grammar (docs/structured.md).

The walk of docs/algorithm.md §3–§4, run on the host with the grammar beside
it: at each position only candidates the grammar allows given the path so far
are scored, a token the grammar forces is taken without asking the drafter
(the canonical tokenization of the bytes it forces: a key, a closing brace),
and a position where none of the drafter's top-K is allowed takes the best
allowed token of its own logits. Drafting stops before an end-of-sequence
token (the target's bonus may still be one). What it returns is the draft,
the proposal each draft token was actually drawn from (zero outside the
grammar), and the grammar's mask for every row the target will verify, so
acceptance and the residual use the masked target distribution: the output
is exactly constrained plain decoding's.
"""

from typing import Callable

import mlx.core as mx
import numpy as np

from ..drafter.propose import Proposal, selector_inputs
from ..drafter.selector import score_lattice
from ..grammar import GrammarState, only_token
from ..sampling import SamplingParams, inverse_cdf


def grammar_propose(drafter, draft_logits: mx.array, hidden: mx.array, anchor: int, sampling: SamplingParams,
                    transform: Callable, key, selector_transform, grammar: GrammarState
                    ) -> tuple[Proposal, np.ndarray]:
    """(proposal of n <= B-1 drafts, masks bool [n + 1, V]); the grammar's state is unchanged."""
    N, V = draft_logits.shape
    greedy = sampling.greedy
    lattice = cand = unary = None
    if drafter.is_dflash2:
        unary, cand_ids, pred, gate = selector_inputs(drafter, draft_logits, hidden, anchor, selector_transform)
        pred_rows, cand_rows, pred_codebook, succ_codebook = drafter.candidate_selector.codebook_rows(pred, cand_ids)
        S = score_lattice(unary, pred_codebook[pred_rows], gate, succ_codebook[cand_rows])
        lattice, cand, unary = np.array(S), np.array(cand_ids), np.array(unary, dtype=np.float32)
    own = transform(draft_logits) if not greedy else draft_logits.astype(mx.float32)  # the fallback rows
    own = np.array(own, dtype=np.float32)
    uniforms = None if greedy else np.array(mx.random.uniform(shape=(N,), key=key))
    draft, q_rows, masks = [], [], []
    prev = 0  # index of the previous pick among its position's candidates; None: not a candidate
    try:
        for t in range(N):
            allowed = grammar.allowed()
            masks.append(allowed)
            forced = grammar.forced()
            if forced is not None and allowed[forced]:  # the grammar writes it: no drafter needed
                token, q = forced, (None if greedy else _one_hot(forced, V))
            else:
                token, q = _pick(t, allowed, prev, lattice, cand, unary, own, sampling, uniforms)
            if token is None or token in grammar.eos:
                break
            prev = int(np.flatnonzero(cand[t] == token)[0]) if cand is not None and token in cand[t] else None
            draft.append(token)
            q_rows.append(q)
            grammar.advance([token])
        else:
            masks.append(grammar.allowed())
    finally:
        grammar.rollback(len(draft))
    q_full = None if greedy else mx.array(np.stack(q_rows) if q_rows else np.zeros((0, V), np.float32))
    return Proposal(mx.array(draft, dtype=mx.int32), q_full), np.stack(masks)


def _pick(t, allowed, prev, lattice, cand, unary, own, sampling, uniforms):
    """(token, its proposal row [V] or None when greedy) at position t; token None: nothing allowed."""
    V = allowed.size
    only = only_token(allowed)
    if only is not None:  # the grammar decides, and the target must agree
        return only, (None if sampling.greedy else _one_hot(only, V))
    if lattice is not None:
        ok = allowed[cand[t]]
        if ok.any():
            # The walk's row: scores given the previous pick, or the unary scores when that was
            # not one of its position's candidates (forced, or taken from the drafter's logits).
            scores = lattice[t, prev] if prev is not None else unary[t]
            scores = np.where(ok, scores, -np.inf)
            if sampling.greedy:
                return int(cand[t, int(np.argmax(scores))]), None
            q = _softmax(scores / sampling.temperature)
            i = inverse_cdf(q, uniforms[t])
            row = np.zeros(V, np.float32)
            row[cand[t]] = q
            return int(cand[t, i]), row
    if not allowed.any():
        return None, None
    scores = np.where(allowed, own[t], -np.inf)
    if not np.isfinite(scores).any():  # the sampling filters removed every allowed token: any is fine
        scores = np.where(allowed, 0.0, -np.inf)
    if sampling.greedy:
        return int(np.argmax(scores)), None
    q = _softmax(scores)  # `own` is already the sampling transform of the drafter's logits
    return inverse_cdf(q, uniforms[t]), q.astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - np.max(x))
    return e / e.sum()


def _one_hot(token: int, V: int) -> np.ndarray:
    row = np.zeros(V, np.float32)
    row[token] = 1.0
    return row
