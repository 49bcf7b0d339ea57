"""Drafter losses (the block of docs/algorithm.md §1, the selector of §3) and teacher-forced metrics."""

import math

import mlx.core as mx
import mlx.nn as nn

from ..engine.logit_transform import LogitTransform, apply_logit_transform
from ..engine.drafter.selector import top_k_candidates


def decay_gamma(block_size: int) -> float:
    """Position-decay constant of the reference recipes: 7 (B=16), 5 (B=10), 4 (B=8)."""
    if block_size >= 16:
        return 7.0
    if block_size >= 10:
        return 5.0
    return 4.0


def block_loss(logits: mx.array, labels: mx.array) -> mx.array:
    """Cross-entropy over rows k = 1..B-1 weighted exp(-(k-1)/γ). logits [NB, B-1, V]."""
    Bm1 = labels.shape[1]
    gamma = decay_gamma(Bm1 + 1)
    w = mx.array([math.exp(-k / gamma) for k in range(Bm1)], dtype=mx.float32)
    ce = nn.losses.cross_entropy(logits.astype(mx.float32), labels, reduction="none")  # [NB, B-1]
    return mx.sum(ce * w) / (ce.shape[0] * mx.sum(w))


def selector_loss(drafter, logits, hidden, block_inputs, labels, selector_transform: LogitTransform):
    """CE of the selector scores over the drafter's own top-K, with the *true*
    previous token as predecessor; positions whose label is not in the top-K
    contribute nothing. Averaged over all positions (not only the scored ones)
    so that every data-parallel shard uses the same normaliser and averaging
    shard gradients equals the one-process gradient.
    Returns (loss, number of scored positions)."""
    config = drafter.config
    K = config.selector_top_k
    NB, Bm1, V = logits.shape
    flat = logits.reshape(NB * Bm1, V)
    _, cand = top_k_candidates(mx.stop_gradient(flat), K)
    unary = mx.take_along_axis(flat.astype(mx.float32), cand, axis=-1)
    unary = apply_logit_transform(unary, selector_transform)
    pred = mx.concatenate([block_inputs[:, :1], labels[:, :-1]], axis=1).reshape(-1)
    scores = drafter.candidate_selector.true_predecessor_scores(unary, cand, hidden.reshape(NB * Bm1, -1), pred)
    hit = cand == labels.reshape(-1, 1)
    valid = mx.any(hit, axis=-1)
    target = mx.argmax(hit, axis=-1)
    ce = nn.losses.cross_entropy(scores, target, reduction="none")
    return mx.sum(mx.where(valid, ce, 0.0)) / ce.shape[0], mx.sum(valid)


def recall_by_position(logits: mx.array, labels: mx.array, K: int) -> tuple[mx.array, mx.array, mx.array]:
    """Conditional Recall@1 and Recall@K per position, as counts.

    Recall@1 at t counts blocks whose earlier positions were all right at
    top-1; Recall@K at t those whose earlier true tokens were all in the top-K
    (the oracle walk's condition; the same definition as `analyze`).
    Returns (hits@1, reached@1, hits@K, reached@K), each [B-1].
    """
    NB, Bm1, V = logits.shape
    _, cand = top_k_candidates(logits.reshape(NB * Bm1, V), K)
    cand = cand.reshape(NB, Bm1, K)
    top1 = (cand[..., 0] == labels).astype(mx.int32)
    inK = mx.any(cand == labels[..., None], axis=-1).astype(mx.int32)

    def conditional(hits):
        before = mx.concatenate([mx.ones((NB, 1), dtype=mx.int32), mx.cumprod(hits, axis=1)[:, :-1]], axis=1)
        return mx.sum(before * hits, axis=0), mx.sum(before, axis=0)

    return (*conditional(top1), *conditional(inK))
