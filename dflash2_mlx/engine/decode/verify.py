"""Acceptance rules for one verified block (docs/algorithm.md §6).

Everything stays on the device: the caller fetches (accepted, bonus) in its one
host synchronisation per cycle.
"""

from typing import Callable

import mlx.core as mx

from ..sampling import greedy_token


def _leading_run(ok: mx.array) -> mx.array:
    """Length of the leading run of True values."""
    return mx.sum(mx.cumprod(ok.astype(mx.int32))).astype(mx.int32)


def residual(p: mx.array, q: mx.array) -> mx.array:
    """normalise(max(p - q, 0)) per row (p where that is all zero): what a
    rejected draw from q is replaced by, so the token is exactly p in total.
    The one definition, for the chain and the tree."""
    r = mx.maximum(p - q, 0.0)
    mass = mx.sum(r, axis=-1, keepdims=True)
    return mx.where(mass > 0, r / mx.where(mass > 0, mass, 1.0), p)


def accept_greedy(draft: mx.array, logits: mx.array) -> tuple[mx.array, mx.array]:
    """draft [B-1], target logits [B, V] -> (accepted a, bonus token).

    Accept while each draft equals the target's argmax; the bonus is the
    target's argmax after the last accepted draft.
    """
    picks = greedy_token(logits)
    a = _leading_run(draft == picks[:-1])
    return a, picks[a]


def accept_sampled(
    draft: mx.array,
    q_full: mx.array,
    logits: mx.array,
    transform: Callable[[mx.array], mx.array],
    key: mx.array,
) -> tuple[mx.array, mx.array]:
    """Exact rejection sampling.

    draft [B-1]; q_full [B-1, V] the proposal each draft was drawn from (zero
    outside its support); logits [B, V]. Accept draft_t with probability
    min(1, p(draft_t) / q(draft_t)); at the first rejection draw from
    normalize(max(0, p - q)) over the full vocabulary (p if that is all zero);
    after a fully accepted block draw the bonus from the last row's p.
    """
    k_accept, k_bonus = mx.random.split(key, 2)
    p = mx.softmax(transform(logits), axis=-1, precise=True)
    idx = draft[:, None]
    p_draft = mx.take_along_axis(p[:-1], idx, axis=-1)[:, 0]
    q_draft = mx.take_along_axis(q_full, idx, axis=-1)[:, 0]
    u = mx.random.uniform(shape=p_draft.shape, key=k_accept)
    a = _leading_run(u * q_draft < p_draft)
    # One candidate bonus per possible stopping point; keep the one at a.
    choices = mx.concatenate([residual(p[:-1], q_full), p[-1:]], axis=0)
    bonus = mx.random.categorical(mx.log(choices), axis=-1, key=k_bonus).astype(mx.int32)
    return a, bonus[a]
