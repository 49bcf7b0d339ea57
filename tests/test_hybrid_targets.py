"""Hybrid (Gated DeltaNet + attention) and sliding-window targets.

qwen3_5-family caches hold recurrent state that cannot be trimmed, and
sliding-window caches overwrite rows once they wrap; the target snapshots /
rings them so that speculative decoding still rolls back exactly. Greedy
parity is asserted bitwise: on the CPU backend a block forward through these
targets equals the same tokens fed one by one (checked below, including the
Gated DeltaNet recurrence itself).
"""

import json
from functools import lru_cache
from pathlib import Path
import tempfile

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.target.caches import RecurrentCache, WindowKVCache
from dflash2_mlx.engine.pair import compatibility_report, selector_transform
from dflash2_mlx.engine.decode.loop import DecodeCache
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.errors import UnsupportedModelError
from dflash2_mlx.loading.checkpoints import load_target
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, write_target
from dflash2_mlx.engine.target.adapter import Target, check_supported
from helpers import (ScriptedDrafter, ar_tokens, assert_blocks_bitwise_single_steps, assert_window_wrap_matches_uncached,
                     decode_steps)

WINDOW = 8
# Extra config per test family. Muse Glimmer is untied like the real model (a
# tied random one just echoes its input); llama gets sliding layers.
FAMILIES = {
    "qwen3_5": {},
    "qwen3_5_moe": {},
    "qwen3_next": {},
    "muse_glimmer": dict(tie_word_embeddings=False, sliding_window=WINDOW),
    "llama_sliding": dict(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=WINDOW),
}
MAIN = ["qwen3_5", "muse_glimmer"]
SLIDING = ["muse_glimmer", "llama_sliding"]
# Short, medium, and longer than a ring write (a prefill chunk that takes the long path).
PROMPTS = {"short": [5], "medium": [17, 42, 99, 7, 250, 3, 61, 8, 9, 10, 11, 12], "long": list(range(20, 120, 3))}
_ROOT = Path(tempfile.mkdtemp(prefix="dflash2-hybrid-"))


def _model_type(family: str) -> str:
    return "llama" if family == "llama_sliding" else family


@lru_cache(maxsize=None)
def target_folder(family: str) -> Path:
    folder = _ROOT / family
    if not folder.exists():
        write_target(folder, _model_type(family), **FAMILIES[family])
    return folder


LAYER_IDS = (1, 2)  # taps for the feature checks


def load(family: str) -> Target:
    return load_target(str(target_folder(family)))[0]


def fresh_drafter(family: str, kind: str = "dflash", **dflash):
    config = json.loads((target_folder(family) / "config.json").read_text())
    return random_drafter(drafter_config_dict(config, kind, block_size=16, **dflash), seed=1)


@lru_cache(maxsize=None)
def drafter(family: str, kind: str = "dflash"):
    return fresh_drafter(family, kind)


LONGEST = 16 * 17 // 2 + 2 * 16 + 16  # the scripted test's B = 16: its tokens and one block more


@lru_cache(maxsize=None)
def greedy(family: str, prompt_name: str, n: int) -> list[int]:
    """Plain greedy decoding of n tokens after PROMPTS[prompt_name] by the family's
    target, decoded once: greedy m tokens are the first m of a longer run, so one decode
    serves every B (and both drafter kinds)."""
    return ar_tokens(load(family), PROMPTS[prompt_name], n)


def spec(target, drafter, prompt, B, n, **kw):
    steps = list(decode_steps(prompt, Pair.make(target, drafter), DecodeRequest(max_tokens=n, block_size=B, **kw)))
    return [t for s in steps for t in s.tokens], steps


def _first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token {i}: {x} vs {y}"
    return f"length {len(a)} vs {len(b)}"


# -- the target forward -------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_caches_are_the_rollback_kinds(family):
    target = load(family)
    kinds = {type(c) for c in target.make_cache()}
    if family in SLIDING:
        assert WindowKVCache in kinds
    else:
        assert RecurrentCache in kinds
    assert target.model_type == _model_type(family)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_model_call_with_its_own_cache(family):
    """Bitwise `model(...)` with mlx-lm's own caches, chunk by chunk, while a
    sliding window has not wrapped (mlx-lm's rotating cache then reorders rows)."""
    target = load(family)
    ids = mx.array([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]])
    stop = WINDOW if family in SLIDING else ids.shape[1]
    ref_cache, cache = target.model.make_cache(), target.make_cache()
    for chunk in (ids[:, :5], ids[:, 5:6], ids[:, 6:stop]):
        ref = target.model(chunk, cache=ref_cache)
        logits, feats = target(chunk, cache, LAYER_IDS)
        assert np.array_equal(np.array(ref), np.array(logits))
        assert feats.shape == (1, chunk.shape[1], 2 * target.hidden_size)


@pytest.mark.parametrize("family", SLIDING)
def test_window_is_enforced_after_wrapping(family):
    assert_window_wrap_matches_uncached(load(family), 70)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_block_forward_is_bitwise_single_steps(family):
    """Past the sliding window's wrap, and through the recurrent layers."""
    assert_blocks_bitwise_single_steps(load(family), 60)


def test_gated_delta_recurrence_chunk_equals_steps():
    """mlx-lm's Gated DeltaNet update over T rows at once equals T one-row
    updates bitwise on this backend (its CPU path is a per-row loop)."""
    from mlx_lm.models.gated_delta import gated_delta_update

    mx.random.seed(0)
    B, T, Hk, Hv, Dk, Dv = 1, 7, 2, 4, 32, 16
    q, k = mx.random.normal((B, T, Hk, Dk)), mx.random.normal((B, T, Hk, Dk))
    v, a, b = mx.random.normal((B, T, Hv, Dv)), mx.random.normal((B, T, Hv)), mx.random.normal((B, T, Hv))
    A_log, dt_bias = mx.random.normal((Hv,)), mx.ones((Hv,))
    state0 = mx.random.normal((B, Hv, Dv, Dk))
    y_all, s_all = gated_delta_update(q, k, v, a, b, A_log, dt_bias, state0)
    state, ys = state0, []
    for t in range(T):
        y, state = gated_delta_update(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], a[:, t : t + 1],
                                      b[:, t : t + 1], A_log, dt_bias, state)
        ys.append(y)
    assert np.array_equal(np.array(y_all), np.array(mx.concatenate(ys, axis=1)))
    assert np.array_equal(np.array(s_all), np.array(state))


# -- Muse Glimmer's embedding and logits -----------------------------------------------


def test_muse_glimmer_embed_and_head_are_the_models():
    target = load("muse_glimmer")
    inner = target.model.model
    ids = mx.array([[4, 8, 15, 16, 23, 42]])
    emb = target.embed(ids)
    # What the first layer receives: the scaleless-RMS-normed embedding.
    assert np.array_equal(np.array(emb), np.array(mx.fast.rms_norm(inner.embed_tokens(ids), None, inner.embed_eps)))
    assert not np.allclose(np.array(emb), np.array(inner.embed_tokens(ids)))
    logits, feats = target(ids, target.make_cache(), [3])
    assert np.array_equal(np.array(target.lm_head(inner.norm(feats))), np.array(logits))
    assert np.array_equal(np.array(logits), np.array(target.model(ids)))
    assert float(mx.abs(logits).max()) < target.args.final_logit_softcapping
    assert target.logit_transform == (target.args.output_multiplier, target.args.final_logit_softcapping)


def test_selector_unary_transform_is_applied_once():
    """The released Muse Glimmer drafter declares the target's own multiplier
    and softcap; `Target.lm_head` already applies them, so nothing is left."""
    target = load("muse_glimmer")
    multiplier, cap = target.logit_transform
    d = fresh_drafter("muse_glimmer", "dflash2", output_multiplier=multiplier, final_logit_softcapping=cap)
    assert selector_transform(d, target) == (1.0, None)
    assert [c.ok for c in compatibility_report(d, target) if c.name == "logit_transform"] == [True]
    # Declared values that are neither the target's nor identity are refused.
    d = fresh_drafter("muse_glimmer", "dflash2", output_multiplier=0.5, final_logit_softcapping=cap)
    assert [c.ok for c in compatibility_report(d, target) if c.name == "logit_transform"] == [False]
    # A target with plain logits: the declared transform is the selector's to apply.
    d = fresh_drafter("qwen3_5", "dflash2", output_multiplier=0.5, final_logit_softcapping=30.0)
    assert selector_transform(d, load("qwen3_5")) == (0.5, 30.0)


def test_propose_unary_is_the_targets_final_logits():
    from dflash2_mlx.engine.drafter.propose import selector_inputs
    from dflash2_mlx.engine.drafter.selector import top_k_candidates

    target = load("muse_glimmer")
    multiplier, cap = target.logit_transform
    d = fresh_drafter("muse_glimmer", "dflash2", output_multiplier=multiplier, final_logit_softcapping=cap)
    hidden = mx.random.normal((3, target.hidden_size))
    logits = target.lm_head(hidden)
    unary, cand, _, _ = selector_inputs(d, logits, hidden, anchor=5, selector_transform=selector_transform(d, target))
    values, idx = top_k_candidates(logits, d.config.selector_top_k)
    assert np.array_equal(np.array(cand), np.array(idx))
    assert np.array_equal(np.array(unary), np.array(values))


# -- greedy parity -----------------------------------------------------------------------


@pytest.mark.parametrize("family", MAIN)
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_scripted_drafter_hits_every_acceptance_length(family, prompt_name):
    """B = 2, 4, 8, 16; at least 64 tokens (8 windows); acceptance 0..B-1 all seen."""
    target = load(family)
    base = drafter(family)
    prompt = PROMPTS[prompt_name]
    n_for = lambda B: max(64, B * (B + 1) // 2 + 2 * B)
    reference = greedy(family, prompt_name, LONGEST)
    assert len(reference) >= n_for(16) + 16
    assert len(set(reference[: n_for(2) + 2])) > 10, "the tiny target's greedy output should vary"
    for B in (2, 4, 8, 16):
        n = n_for(B)
        d = ScriptedDrafter(base, reference, len(prompt), lambda c, B=B: c % B, target.vocab_size)
        out, steps = spec(target, d, prompt, B, n)
        assert out == reference[:n], f"{family} B={B}: diverged at {_first_diff(out, reference)}"
        lengths = {s.accepted for s in steps[1:] if s.drafted == B - 1}
        assert lengths == set(range(B)), f"{family} B={B}: lengths seen {sorted(lengths)}"


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen3_next", "llama_sliding"])
def test_scripted_parity_other_families(family):
    target = load(family)
    prompt = PROMPTS["medium"]
    for B in (3, 8):
        n = 64
        reference = ar_tokens(target, prompt, n + B)
        d = ScriptedDrafter(drafter(family), reference, len(prompt), lambda c, B=B: c % B, target.vocab_size)
        out, steps = spec(target, d, prompt, B, n)
        assert out == reference[:n], f"{family} B={B}: diverged at {_first_diff(out, reference)}"
        assert {s.accepted for s in steps[1:] if s.drafted == B - 1} == set(range(B))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_random_drafter_parity(family, kind):
    target, d = load(family), drafter(family, kind)
    for name in ("short", "long"):
        prompt, reference = PROMPTS[name], greedy(family, name, 48)
        for B in (2, 5, 16):
            out, _ = spec(target, d, prompt, B, 48)
            assert out == reference, f"{family} B={B}: diverged at {_first_diff(out, reference)}"


@pytest.mark.parametrize("family", MAIN)
def test_generation_continues_from_a_closed_cache(family):
    """Closing either decoder early leaves the cache at 'all committed tokens but
    the last' (the AR look-ahead and the last verify undone), so continuing from
    it gives the uninterrupted continuation."""
    target = load(family)
    prompt = PROMPTS["medium"]
    reference = ar_tokens(target, prompt, 60)
    cache = DecodeCache(target.make_cache())
    steps = decode_steps(prompt, Pair.make(target), DecodeRequest(max_tokens=100), prompt_cache=cache)
    out = [next(steps).tokens[0] for _ in range(25)]
    steps.close()  # with the next token already computed (the look-ahead)
    assert cache.offset == len(cache.tokens) - 1
    more = decode_steps([out[-1]], Pair.make(target), DecodeRequest(max_tokens=35), prompt_cache=cache)
    assert out + [s.tokens[0] for s in more] == reference[:60]

    d = drafter(family)
    cache = DecodeCache(target.make_cache(), d.make_cache())
    steps = decode_steps(prompt, Pair.make(target, d), DecodeRequest(max_tokens=100, block_size=6), prompt_cache=cache)
    out = [t for _ in range(8) for t in next(steps).tokens]
    steps.close()
    assert cache.offset == len(cache.tokens) - 1
    more = decode_steps([out[-1]], Pair.make(target, d), DecodeRequest(max_tokens=60 - len(out), block_size=6),
                        prompt_cache=cache)
    assert out + [t for s in more for t in s.tokens] == reference[:60]


# -- rollback memory ----------------------------------------------------------------------


def test_recurrent_snapshot_bytes_match_the_formula():
    """Per cycle a snapshot keeps each recurrent layer's state (conv + delta
    state) and its L input rows: n_rec × ((K-1)·conv_dim·b + Hv·Dv·Dk·4 + L·Ht·b)."""
    target = load("qwen3_5")
    args = target.args
    cache = target.make_cache()
    target(mx.array([[1, 2, 3, 4, 5]]), cache)
    L = 6
    _, _, undo = target.forward_undoable(mx.array([list(range(10, 10 + L))]), cache)
    snap = undo.snapshot
    n_rec = sum(isinstance(c, RecurrentCache) for c in cache)
    b = mx.float32.size
    conv_dim = 2 * args.linear_num_key_heads * args.linear_key_head_dim + args.linear_num_value_heads * args.linear_value_head_dim
    state = args.linear_num_value_heads * args.linear_value_head_dim * args.linear_key_head_dim * 4
    expected = n_rec * ((args.linear_conv_kernel_dim - 1) * conv_dim * b + state + L * args.hidden_size * b)
    assert snap.nbytes == expected
    target.rollback(cache, undo, keep=2)
    assert all(c.offset == 7 for c in cache)


def test_window_cache_extra_bytes_match_the_formula():
    """Rotating layers hold max_block rows beyond their window:
    n_sliding × max_block × 2 × n_kv_heads × head_dim × b."""
    target = load("muse_glimmer")
    target.max_block = 4
    cache = target.make_cache()
    target(mx.array([list(range(1, 40))]), cache)
    args = target.args
    window = [c for c in cache if isinstance(c, WindowKVCache)]
    assert len(window) == args.layer_types.count("sliding_attention") == 3
    expected = len(window) * 4 * 2 * args.num_key_value_heads * args.head_dim * mx.float32.size
    assert sum(c.extra_nbytes for c in window) == expected
    assert all(c.keys.shape[2] == WINDOW + 4 for c in window)


# -- what is still refused ------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["gemma2", "jamba", "mamba", "falcon_h1", "gpt2"])
def test_other_families_refused_by_name(model_type):
    with pytest.raises(UnsupportedModelError, match=model_type):
        check_supported(model_type)


def test_attention_sink_rotating_cache_refused():
    from mlx_lm.models.cache import RotatingKVCache

    target = load("llama_sliding")
    with pytest.raises(UnsupportedModelError, match="attention-sink"):
        target._rollback_cache(RotatingKVCache(max_size=8, keep=4))


def test_block_larger_than_rollback_room_is_refused():
    target = load("muse_glimmer")
    target.max_block = 8
    checks = {c.name: c for c in compatibility_report(drafter("muse_glimmer"), target)}
    assert not checks["block_size"].ok and "rollback room 8" in checks["block_size"].message
    assert "block_size" not in {c.name for c in compatibility_report(drafter("qwen3_5"), load("qwen3_5"))}


# -- exact sampling ----------------------------------------------------------------------------

SAMPLING_PROMPT = [1, 5, 2, 7, 3, 6, 4, 1]  # longer than the window below: rollbacks run wrapped


def _tiny_sampling_pair(family: str):
    """A V=8 target (window 4, ring room 3 rows) and a DFlash 2 drafter for it."""
    from dflash2_mlx.loading.model_classes import model_classes
    from dflash2_mlx.tools.synthetic import target_config
    from test_sampling import V, tiny_drafter

    extra = dict(tie_word_embeddings=False, sliding_window=4,
                 layer_types=["sliding_attention", "full_attention"]) if family == "muse_glimmer" else {}
    cfg = target_config(family, vocab_size=V, hidden_size=32, num_hidden_layers=2, **extra)
    model_cls, args_cls = model_classes(cfg)
    mx.random.seed(7)
    target = Target(model_cls(args_cls.from_dict(cfg)), max_block=4)  # the drafter block size: the ring still wraps
    return target, tiny_drafter(cfg, "dflash2")


def _exact_distribution(target, sampling):
    """P(first three generated tokens) enumerated from the target (V^3 cells)."""
    from dflash2_mlx.engine.sampling import make_logprobs_transform
    from test_sampling import V

    transform = make_logprobs_transform(sampling)

    def probs(prefix):
        logits, _ = target(mx.array([SAMPLING_PROMPT + list(prefix)]), target.make_cache())
        return np.array(mx.softmax(transform(logits[0, -1]), axis=-1))

    table, p1 = {}, probs(())
    for a in range(V):
        p2 = probs((a,))
        for b in range(V):
            p3 = probs((a, b))
            for c in range(V):
                table[(a, b, c)] = p1[a] * p2[b] * p3[c]
    return table


@pytest.mark.slow
@pytest.mark.parametrize("family", MAIN)
def test_sampling_matches_target_distribution(family):
    """Chi-square at ALPHA against the enumerated distribution (test_sampling's
    method), through recurrent snapshots / a wrapped ring and rejections."""
    from dflash2_mlx.engine.sampling import SamplingParams
    from test_sampling import ALPHA, gof_pvalue, sample_counts

    target, d = _tiny_sampling_pair(family)
    settings = SamplingParams(temperature=1.0)
    table = _exact_distribution(target, settings)
    # 1,500, not test_sampling's 1,000: these distributions are near uniform over 512 cells, and at
    # 1,000 samples no cell expects 5 (the chi-square had one pooled cell and no degree of freedom).
    n = 1500

    def gen(seed):
        s = SamplingParams(temperature=1.0, seed=seed)
        request = DecodeRequest(max_tokens=3, block_size=3, sampling=s)
        return decode_steps(SAMPLING_PROMPT, Pair.make(target, d), request)

    p = gof_pvalue(sample_counts(gen, n), table, n)
    print(f"{family}: chi-square p = {p:.3g}")
    assert p > ALPHA, f"{family}: chi-square p = {p:.2e}"
