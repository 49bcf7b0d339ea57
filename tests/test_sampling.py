"""Exact rejection sampling reproduces the target's own sampling distribution.

On an 8-token vocabulary the exact autoregressive distribution of the first
three generated tokens is enumerated from the target; speculative samples are
compared with it by a chi-square goodness-of-fit test at significance
ALPHA (cells with expected count < 5 pooled; a sample in a cell of probability
zero fails outright). Seeds are fixed, so the test is deterministic; a
deliberately wrong acceptance rule must fail the same test.

The exact distribution is mlx-lm's, not ours: each row is built by
`helpers.mlx_lm_distribution` from `mlx_lm.sample_utils` (top-p, min-p, top-k,
then temperature, in `make_sampler`'s order) on the logits of mlx-lm's own
model call, so a wrong filter order or temperature in the code under test
cannot move the reference along with it. Three tokens with a block of 2 commit
the bonus of a fully accepted block (the third token); with a block of 3 or
more that bonus is past max_tokens and cut. DFlash v1, plain decoding and the
bonus are tested in tests/test_sampling_bonus.py (a second file, for a second worker).
"""


import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

import dflash2_mlx.engine.decode.chain as chain
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams, make_logprobs_transform
from dflash2_mlx.loading.model_classes import model_classes
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, target_config
from dflash2_mlx.engine.target.adapter import Target
from helpers import decode_steps, mlx_lm_distribution, mlx_lm_sampler

ALPHA = 1e-3
V, PROMPT, N_SAMPLES = 8, [1, 5, 2], 1000


def tiny_target():
    cfg = target_config("qwen3", vocab_size=V, hidden_size=32, num_hidden_layers=2)
    model_cls, args_cls = model_classes(cfg)
    mx.random.seed(7)
    model = model_cls(args_cls.from_dict(cfg))
    return Target(model), cfg


def tiny_drafter(cfg, kind):
    dcfg = drafter_config_dict(cfg, kind, num_layers=1, block_size=4, target_layer_ids=[0, 1], selector_top_k=4)
    dcfg["dflash_config"]["mask_token_id"] = V - 1
    return random_drafter(dcfg, seed=11)


def exact_distribution(target, sampling):
    """(a, b, c) -> probability that mlx-lm, sampling with `sampling` from the
    same model, generates a, b, c after PROMPT."""

    def probs(prefix):
        logits = target.model(mx.array([PROMPT + list(prefix)]))  # mlx-lm's own forward
        return mlx_lm_distribution(logits[0, -1], sampling)

    p1 = probs(())
    table = {}
    for a in range(V):
        p2 = probs((a,))
        for b in range(V):
            p3 = probs((a, b))
            for c in range(V):
                table[(a, b, c)] = p1[a] * p2[b] * p3[c]
    return table


def sample_counts(generate, n=N_SAMPLES, bonus_after_full=None):
    """Counts of the first three tokens over seeds 0..n-1. `bonus_after_full`,
    a list, receives the number of samples in which a fully accepted block
    committed its bonus token."""
    counts, accepted, drafted, full = {}, 0, 0, 0
    for seed in range(n):
        steps = list(generate(seed))
        toks = tuple(t for s in steps for t in s.tokens)[:3]
        counts[toks] = counts.get(toks, 0) + 1
        accepted += sum(s.accepted for s in steps)
        drafted += sum(s.drafted for s in steps)
        full += any(s.drafted and s.accepted == s.drafted and len(s.tokens) == s.drafted + 1 for s in steps)
    # Both branches of the rule (accept, reject + residual) must be exercised.
    assert drafted == 0 or 0.05 < accepted / drafted < 0.95, (accepted, drafted)
    if bonus_after_full is not None:
        bonus_after_full.append(full)
    return counts


def gof_pvalue(counts, table, n=N_SAMPLES):
    impossible = {k: c for k, c in counts.items() if table.get(k, 0.0) == 0.0}
    assert not impossible, f"samples outside the distribution's support: {impossible}"
    cells = sorted(table, key=lambda k: -table[k])
    expected = np.array([float(table[k]) * n for k in cells], dtype=np.float64)
    observed = np.array([counts.get(k, 0) for k in cells], dtype=float)
    big = expected >= 5
    exp = np.append(expected[big], expected[~big].sum())
    obs = np.append(observed[big], observed[~big].sum())
    # Too few samples for this distribution leave one pooled cell: no degree of freedom, p = 0.
    assert big.sum() >= 2, f"no chi-square test at n = {n}: only {big.sum()} cells expect 5 samples"
    exp *= obs.sum() / exp.sum()
    return chisquare(obs, exp).pvalue


SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=5),
]


@pytest.fixture(scope="module")
def pair():
    target, cfg = tiny_target()
    return target, {k: tiny_drafter(cfg, k) for k in ("dflash", "dflash2")}


def _spec(target, drafter, settings, B=3):
    def gen(seed):
        s = SamplingParams(settings.temperature, settings.top_p, settings.top_k, settings.min_p, seed)
        return decode_steps(PROMPT, Pair.make(target, drafter), DecodeRequest(max_tokens=3, block_size=B, sampling=s))
    return gen


@pytest.mark.slow
@pytest.mark.parametrize("settings", SETTINGS, ids=["t1", "t0.8-top_p0.9", "t1.3-top_k5"])
def test_dflash2_sampling_matches_target_distribution(pair, settings):
    target, drafters = pair
    table = exact_distribution(target, settings)
    p = gof_pvalue(sample_counts(_spec(target, drafters["dflash2"], settings)), table)
    print(f"DFlash 2 {settings}: chi-square p = {p:.3g}")
    assert p > ALPHA, f"chi-square p = {p:.2e}"


# Block 2 with three tokens: when the first cycle accepts its one draft, the
# third token is that full block's bonus, drawn from the target's last row.
# DFlash v1 runs at T != 1 with a filter: its draft must be drawn from exactly
# the tempered, filtered proposal q it reports (at T = 1 unfiltered, both are
# the raw softmax, so a draw from the untempered logits would go unseen).
BONUS_SETTINGS = {
    "dflash2": SamplingParams(temperature=0.7, top_p=0.95, min_p=0.1),
    "dflash": SamplingParams(temperature=2.0, top_k=4),
}
def _bonus_from_p(draft, q_full, logits, transform, key):
    """A plausible but wrong rule: after a rejection, resample from p, not p - q."""
    k_accept, k_bonus = mx.random.split(key, 2)
    p = mx.softmax(transform(logits), axis=-1)
    pd = mx.take_along_axis(p[:-1], draft[:, None], axis=-1)[:, 0]
    qd = mx.take_along_axis(q_full, draft[:, None], axis=-1)[:, 0]
    u = mx.random.uniform(shape=pd.shape, key=k_accept)
    a = mx.sum(mx.cumprod((u * qd < pd).astype(mx.int32))).astype(mx.int32)
    bonus = mx.random.categorical(transform(logits), axis=-1, key=k_bonus).astype(mx.int32)
    return a, bonus[a]


@pytest.mark.slow
def test_wrong_acceptance_rule_fails_the_same_test(pair, monkeypatch):
    target, drafters = pair
    settings = SETTINGS[0]
    table = exact_distribution(target, settings)
    monkeypatch.setattr(chain, "accept_sampled", _bonus_from_p)
    p = gof_pvalue(sample_counts(_spec(target, drafters["dflash2"], settings)), table)
    print(f"wrong rule: chi-square p = {p:.3g}")
    assert p < ALPHA, f"the wrong rule passed: chi-square p = {p:.2e}"


@pytest.mark.parametrize("kind", ["ar", "dflash2"])
def test_greedy_decoding_draws_nothing_from_the_generator(kind):
    """Greedy decoding is deterministic without a key: it must not take one from
    MLX's global generator (nor split one every step, which grew an unevaluated
    graph a node per token), so a caller's seeded stream is left where it was."""
    target, cfg = tiny_target()
    pair = Pair.make(target, None if kind == "ar" else tiny_drafter(cfg, kind))
    mx.random.seed(123)
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(123)
    request = DecodeRequest(max_tokens=12, sampling=SamplingParams(), block_size=None)
    tokens = [t for s in decode_steps(PROMPT, pair, request) for t in s.tokens]
    assert len(tokens) == 12
    assert mx.array_equal(mx.random.uniform(shape=(4,)), expected)


# Temperatures and filters, alone and together (top_k below the vocabulary:
# mlx-lm's apply_top_k refuses k >= V).
TRANSFORM_SETTINGS = [
    SamplingParams(temperature=t, top_p=top_p, min_p=min_p, top_k=top_k)
    for t in (0.5, 0.8, 1.0, 1.3, 2.0)
    for top_p, min_p, top_k in [(1.0, 0.0, 0), (0.9, 0.0, 0), (0.5, 0.0, 0), (1.0, 0.1, 0), (1.0, 0.3, 0),
                                (1.0, 0.0, 3), (1.0, 0.0, 5), (0.9, 0.05, 5), (0.7, 0.2, 4)]
]


def _reference_rows(target):
    """Logits rows to compare on: the target's after PROMPT and after each first
    token, and random rows of a wider spread."""
    rows = [target.model(mx.array([PROMPT + prefix]))[0, -1] for prefix in [[]] + [[a] for a in range(V)]]
    rows.append(3.0 * mx.random.normal((16, V), key=mx.random.key(5)))
    return mx.concatenate([mx.stack(rows[:-1]), rows[-1]], axis=0)


def test_target_distribution_is_mlx_lms():
    """The distribution speculative and AR decoding sample from (the softmax of
    `make_logprobs_transform`) equals mlx-lm's for every setting: same support,
    same probabilities. Temperature applied before top-p or min-p moves the
    kept set, and fails here without any sampling noise."""
    target, _ = tiny_target()
    rows = _reference_rows(target)
    for s in TRANSFORM_SETTINGS:
        ours = np.array(mx.softmax(make_logprobs_transform(s)(rows), axis=-1, precise=True), dtype=np.float64)
        ref = mlx_lm_distribution(rows, s)
        assert np.array_equal(ours == 0, ref == 0), f"{s}: support differs from mlx-lm's"
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6, err_msg=str(s))


def test_reference_distribution_is_what_mlx_lm_samples():
    """`helpers.mlx_lm_distribution` (the reference every test here compares
    with) is the distribution mlx-lm's own `make_sampler` draws from: 20000
    draws per setting and row, chi-square at ALPHA, nothing drawn outside the
    support. Guards the reference against misreading mlx-lm's order (or a
    later mlx-lm changing it)."""
    target, _ = tiny_target()
    rows = _reference_rows(target)[:3]
    n = 20000
    mx.random.seed(0)  # make_sampler draws from MLX's global generator
    for s in [SETTINGS[1], SETTINGS[2], BONUS_SETTINGS["dflash2"], BONUS_SETTINGS["dflash"],
              SamplingParams(temperature=0.5, top_p=0.8), SamplingParams(temperature=1.5, top_p=0.9, min_p=0.05, top_k=5)]:
        sampler = mlx_lm_sampler(s)
        for row in rows:
            logprobs = row - mx.logsumexp(row, keepdims=True)  # what generate_step hands its sampler
            draws = np.array(sampler(mx.broadcast_to(logprobs[None], (n, V))))
            observed = np.bincount(draws, minlength=V).astype(float)
            expected = mlx_lm_distribution(row, s) * n
            assert observed[expected == 0].sum() == 0, f"{s}: mlx-lm drew outside the reference support"
            keep = expected > 0
            p = chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue
            assert p > ALPHA, f"{s}: mlx-lm's sampler vs the reference, chi-square p = {p:.2e}"
