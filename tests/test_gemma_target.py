"""Gemma 3 text targets (mlx-lm `gemma3_text`).

Sliding layers ([local, local, global] repeating, a window of 8) get
`WindowKVCache`s; the embedding is scaled by sqrt(hidden_size) *rounded to
bfloat16*, as `Gemma3Model.__call__` does. The targets here have hidden 48:
sqrt(48) = 6.928... is 6.9375 in bfloat16, so an embedding scaled by the
unrounded value is caught. Greedy parity is asserted token for token.
"""

import json
from functools import lru_cache
from pathlib import Path
import tempfile

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from dflash2_mlx.engine.kv_buckets import BucketedKVCache

from dflash2_mlx.engine.target.caches import WindowKVCache
from dflash2_mlx.engine.pair import compatibility_report, selector_transform
from dflash2_mlx.errors import UnsupportedModelError
from dflash2_mlx.loading.checkpoints import load_target
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, write_target
from dflash2_mlx.engine.target.adapter import Target, check_supported
from helpers import (ScriptedDrafter, ar_tokens, assert_blocks_bitwise_single_steps,
                     assert_window_wrap_matches_uncached)
from test_hybrid_targets import PROMPTS, _first_diff, spec

WINDOW = 8
HIDDEN = 48
_ROOT = Path(tempfile.mkdtemp(prefix="dflash2-gemma-"))


@lru_cache(maxsize=None)
def target_folder(tie: bool) -> Path:
    """Tied as the real checkpoints (no lm_head tensor) or untied (varied greedy output)."""
    folder = _ROOT / f"gemma3_text-{tie}"
    if not folder.exists():
        write_target(folder, "gemma3_text", hidden_size=HIDDEN, tie_word_embeddings=tie, sliding_window=WINDOW)
    return folder


LAYER_IDS = (1, 2)  # taps for the feature checks


def load(tie: bool = False) -> Target:
    return load_target(str(target_folder(tie)))[0]


@lru_cache(maxsize=None)
def drafter(kind: str = "dflash", tie: bool = False):
    config = json.loads((target_folder(tie) / "config.json").read_text())
    return random_drafter(drafter_config_dict(config, kind, block_size=16), seed=1)


# -- the adapter -------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_supported_with_rollback_caches(tie):
    check_supported("gemma3_text")
    target = load(tie)
    assert target.model_type == "gemma3_text"
    assert target.tied_embeddings is tie
    assert (getattr(target.model, "lm_head", None) is None) is tie
    assert target.vocab_size == target.embedding_rows == 384
    cache = target.make_cache()
    # Pattern 3: layers 0, 1, 3 slide, layer 2 is global.
    assert [type(c) for c in cache] == [WindowKVCache, WindowKVCache, BucketedKVCache, WindowKVCache]
    assert all(c.window == WINDOW for c in cache if isinstance(c, WindowKVCache))
    assert target.has_window_layers
    assert target.logit_transform == (1.0, None)


@pytest.mark.parametrize("tie", [True, False])
def test_logits_equal_model_call_with_its_own_cache(tie):
    """Bitwise `model(...)` with mlx-lm's own caches, chunk by chunk, while the
    window has not wrapped (mlx-lm's rotating cache then reorders rows)."""
    target = load(tie)
    ids = mx.array([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])
    ref_cache, cache = target.model.make_cache(), target.make_cache()
    for chunk in (ids[:, :5], ids[:, 5:6], ids[:, 6:WINDOW]):
        ref = target.model(chunk, cache=ref_cache)
        logits, feats = target(chunk, cache, LAYER_IDS)
        assert np.array_equal(np.array(ref), np.array(logits))
        assert feats.shape == (1, chunk.shape[1], 2 * HIDDEN)
    # One uncached forward over more than the window: bitwise too.
    logits, _ = target(ids, target.make_cache())
    assert np.array_equal(np.array(target.model(ids)), np.array(logits))


def test_window_is_enforced_after_wrapping():
    assert_window_wrap_matches_uncached(load(), 50)


def test_block_forward_is_bitwise_single_steps():
    assert_blocks_bitwise_single_steps(load(), 40)


class _Recorder(nn.Module):
    """Stands in for layer 0 of one model instance and keeps what it receives."""

    def __init__(self, layer):
        super().__init__()
        self.layer, self.seen = layer, []

    def __call__(self, x, mask=None, cache=None):
        self.seen.append(x)
        return self.layer(x, mask, cache)


@pytest.mark.parametrize("tie", [True, False])
def test_embed_is_what_the_first_layer_receives(tie):
    """`Target.embed` (the drafter's block rows) is the model's scaled embedding:
    sqrt(48) rounded to bfloat16 (6.9375), in the activation dtype."""
    target = load(tie)
    inner = target.model.model
    ids = mx.array([[4, 8, 15, 16, 23, 42, 383]])  # 383: the drafter's mask row
    emb = target.embed(ids)
    first = inner.layers[0]
    inner.layers[0] = recorder = _Recorder(first)
    try:
        target.model(ids)
    finally:
        inner.layers[0] = first
    assert np.array_equal(np.array(emb), np.array(recorder.seen[0]))
    raw = inner.embed_tokens(ids)
    assert emb.dtype == raw.dtype == target.activation_dtype
    assert np.array_equal(np.array(emb), np.array(raw * 6.9375))
    # Not the raw table, and not the unrounded scale either.
    assert not np.allclose(np.array(emb), np.array(raw))
    assert not np.array_equal(np.array(emb), np.array(raw * mx.array(HIDDEN**0.5, raw.dtype)))


@pytest.mark.parametrize("tie", [True, False])
def test_lm_head_is_the_models_head(tie):
    target = load(tie)
    inner = target.model.model
    ids = mx.array([[4, 8, 15, 16, 23, 42]])
    logits, feats = target(ids, target.make_cache(), [target_num_layers() - 1])
    assert np.array_equal(np.array(target.lm_head(inner.norm(feats))), np.array(logits))
    hidden = inner.norm(feats)
    plain = inner.embed_tokens.as_linear(hidden) if tie else target.model.lm_head(hidden)
    assert np.array_equal(np.array(plain), np.array(logits))


def target_num_layers() -> int:
    return json.loads((target_folder(False) / "config.json").read_text())["num_hidden_layers"]


def test_unfollowed_variants_refused():
    target = load()
    target.model.args.final_logit_softcapping = 30.0
    with pytest.raises(UnsupportedModelError, match="final_logit_softcapping"):
        Target(target.model)


def test_dflash2_drafter_is_compatible_and_keeps_its_declared_transform():
    """Gemma 3 logits are the plain head projection, so a DFlash 2 drafter's
    declared transform is the selector's to apply (as the reference does)."""
    target = load()
    config = json.loads((target_folder(False) / "config.json").read_text())
    d = random_drafter(drafter_config_dict(config, "dflash2", block_size=16,
                                           output_multiplier=0.5, final_logit_softcapping=30.0), seed=1)
    assert all(c.ok for c in compatibility_report(d, target)), compatibility_report(d, target)
    assert selector_transform(d, target) == (0.5, 30.0)


# -- greedy parity --------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_name", ["short", "long"])
def test_scripted_drafter_hits_every_acceptance_length(prompt_name):
    """B = 2, 4, 8; 64 tokens (8 windows); acceptance 0..B-1 all seen."""
    target = load()
    base = drafter()
    prompt = PROMPTS[prompt_name]
    for B in (2, 4, 8):
        n = 64
        reference = ar_tokens(target, prompt, n + B)
        assert len(set(reference)) > 10, "the tiny target's greedy output should vary"
        d = ScriptedDrafter(base, reference, len(prompt), lambda c, B=B: c % B, target.vocab_size)
        out, steps = spec(target, d, prompt, B, n)
        assert out == reference[:n], f"B={B}: diverged at {_first_diff(out, reference)}"
        lengths = {s.accepted for s in steps[1:] if s.drafted == B - 1}
        assert lengths == set(range(B)), f"B={B}: lengths seen {sorted(lengths)}"


def test_scripted_parity_tied():
    target = load(tie=True)
    prompt = PROMPTS["medium"]
    B, n = 4, 48
    reference = ar_tokens(target, prompt, n + B)
    d = ScriptedDrafter(drafter(tie=True), reference, len(prompt), lambda c: c % B, target.vocab_size)
    out, steps = spec(target, d, prompt, B, n)
    assert out == reference[:n], f"diverged at {_first_diff(out, reference)}"
    assert {s.accepted for s in steps[1:] if s.drafted == B - 1} == set(range(B))


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_random_drafter_parity(kind):
    target, d = load(), drafter(kind)
    for prompt in (PROMPTS["short"], PROMPTS["long"]):
        reference = ar_tokens(target, prompt, 40)
        for B in (2, 5, 16):
            out, _ = spec(target, d, prompt, B, 40)
            assert out == reference, f"{kind} B={B}: diverged at {_first_diff(out, reference)}"
