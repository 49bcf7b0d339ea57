"""Exact rejection sampling reproduces the target's own sampling distribution.

On an 8-token vocabulary the exact autoregressive distribution of the first
three generated tokens is enumerated from the target; speculative samples are
compared with it by a chi-square goodness-of-fit test at significance
ALPHA (cells with expected count < 5 pooled). Seeds are fixed, so the test is
deterministic; a deliberately wrong acceptance rule must fail the same test.
"""


import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

import dflash2_mlx.engine.decode.loop as decode
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.decode.loop import autoregressive_generate_step, speculative_generate_step
from dflash2_mlx.engine.sampling import SamplingParams, make_logprobs_transform
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, target_config
from dflash2_mlx.engine.target.adapter import Target

ALPHA = 1e-3
V, PROMPT, N_SAMPLES = 8, [1, 5, 2], 1500


def tiny_target():
    from mlx_lm.utils import _get_classes

    cfg = target_config("qwen3", vocab_size=V, hidden_size=32, num_hidden_layers=2)
    model_cls, args_cls = _get_classes(cfg)
    mx.random.seed(7)
    model = model_cls(args_cls.from_dict(cfg))
    return Target(model), cfg


def tiny_drafter(cfg, kind):
    dcfg = drafter_config_dict(cfg, kind, num_layers=1, block_size=4, target_layer_ids=[0, 1], selector_top_k=4)
    dcfg["dflash_config"]["mask_token_id"] = V - 1
    return random_drafter(dcfg, seed=11)


def exact_distribution(target, sampling):
    transform = make_logprobs_transform(sampling)

    def probs(prefix):
        logits, _ = target(mx.array([PROMPT + list(prefix)]), target.make_cache())
        return np.array(mx.softmax(transform(logits[0, -1]), axis=-1))

    p1 = probs(())
    table = {}
    for a in range(V):
        p2 = probs((a,))
        for b in range(V):
            p3 = probs((a, b))
            for c in range(V):
                table[(a, b, c)] = p1[a] * p2[b] * p3[c]
    return table


def sample_counts(generate, n=N_SAMPLES):
    counts, accepted, drafted = {}, 0, 0
    for seed in range(n):
        steps = list(generate(seed))
        toks = tuple(t for s in steps for t in s.tokens)[:3]
        counts[toks] = counts.get(toks, 0) + 1
        accepted += sum(s.accepted for s in steps)
        drafted += sum(s.drafted for s in steps)
    # Both branches of the rule (accept, reject + residual) must be exercised.
    assert drafted == 0 or 0.05 < accepted / drafted < 0.95, (accepted, drafted)
    return counts


def gof_pvalue(counts, table, n=N_SAMPLES):
    cells = sorted(table, key=lambda k: -table[k])
    expected = np.array([float(table[k]) * n for k in cells], dtype=np.float64)
    observed = np.array([counts.get(k, 0) for k in cells], dtype=float)
    big = expected >= 5
    exp = np.append(expected[big], expected[~big].sum())
    obs = np.append(observed[big], observed[~big].sum())
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
        return speculative_generate_step(PROMPT, Pair.make(target, drafter), max_tokens=3, block_size=B, sampling=s)
    return gen


@pytest.mark.slow
@pytest.mark.parametrize("settings", SETTINGS, ids=["t1", "t0.8-top_p0.9", "t1.3-top_k5"])
def test_dflash2_sampling_matches_target_distribution(pair, settings):
    target, drafters = pair
    table = exact_distribution(target, settings)
    p = gof_pvalue(sample_counts(_spec(target, drafters["dflash2"], settings)), table)
    print(f"DFlash 2 {settings}: chi-square p = {p:.3g}")
    assert p > ALPHA, f"chi-square p = {p:.2e}"


@pytest.mark.slow
def test_dflash_v1_sampling_and_ar_match_target_distribution(pair):
    target, drafters = pair
    settings = SETTINGS[0]
    table = exact_distribution(target, settings)
    p = gof_pvalue(sample_counts(_spec(target, drafters["dflash"], settings, B=4)), table)
    print(f"DFlash v1: chi-square p = {p:.3g}")
    assert p > ALPHA, f"DFlash v1: chi-square p = {p:.2e}"

    def ar(seed):
        s = SamplingParams(temperature=1.0, seed=seed)
        return autoregressive_generate_step(PROMPT, Pair.make(target), max_tokens=3, sampling=s)
    p = gof_pvalue(sample_counts(ar), table)
    print(f"autoregressive: chi-square p = {p:.3g}")
    assert p > ALPHA, f"autoregressive: chi-square p = {p:.2e}"


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
    monkeypatch.setattr(decode, "accept_sampled", _bonus_from_p)
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
    step = autoregressive_generate_step if kind == "ar" else speculative_generate_step
    mx.random.seed(123)
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(123)
    tokens = [t for s in step(PROMPT, pair, max_tokens=12, sampling=SamplingParams()) for t in s.tokens]
    assert len(tokens) == 12
    assert mx.array_equal(mx.random.uniform(shape=(4,)), expected)
