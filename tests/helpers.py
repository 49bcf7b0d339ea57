"""Shared builders for the engine tests: tiny pairs in the real formats and a
drafter whose proposals the test controls."""

import json
from functools import lru_cache
from pathlib import Path
import tempfile

import mlx.core as mx
import numpy as np

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.loading.checkpoints import load_drafter, load_target
from dflash2_mlx.tools.synthetic import drafter_config_dict, write_drafter, write_target

FAMILIES = ["qwen3", "qwen2", "llama", "mistral", "qwen3_moe"]
_ROOT = Path(tempfile.mkdtemp(prefix="dflash2-tests-"))


@lru_cache(maxsize=None)
def target_folder(family: str = "qwen3", quantize_bits=None, tie: bool = True) -> Path:
    folder = _ROOT / f"target-{family}-{quantize_bits}-{tie}"
    if not folder.exists():
        write_target(folder, family, quantize_bits=quantize_bits, tie_word_embeddings=tie)
    return folder


def target_config(family: str = "qwen3", **kw) -> dict:
    return json.loads((target_folder(family, **kw) / "config.json").read_text())


@lru_cache(maxsize=None)
def drafter_folder(family: str = "qwen3", kind: str = "dflash2", seed: int = 0, **cfg) -> Path:
    folder = _ROOT / f"drafter-{family}-{kind}-{seed}-{sorted(cfg.items())}"
    if not folder.exists():
        write_drafter(folder, drafter_config_dict(target_config(family), kind, **cfg), seed=seed)
    return folder


def load_pair_for(family="qwen3", kind="dflash2", quantize_bits=None, **cfg):
    drafter = load_drafter(str(drafter_folder(family, kind, **cfg)))
    target, tokenizer = load_target(str(target_folder(family, quantize_bits)))
    return target, tokenizer, drafter


def ar_tokens(target, prompt, n):
    from dflash2_mlx.engine.decode.loop import autoregressive_generate_step

    return [s.tokens[0] for s in autoregressive_generate_step(prompt, Pair.make(target), max_tokens=n)]


class ScriptedDrafter(Drafter):
    """Proposes `reference` (the target's own continuation) with one wrong token
    at a scheduled position per cycle, so every acceptance length occurs.

    `schedule(cycle)` gives the draft index to corrupt; B-1 or more corrupts none.
    The real drafter forward still runs, so its cache behaves as in production.
    """

    def __init__(self, base: Drafter, reference, prompt_len, schedule, vocab):
        super().__init__(base.config, fc_in_features=base.fc.weight.shape[1])
        self.update(base.parameters())
        if self.is_dflash2:
            sel = self.candidate_selector
            sel.successor_codebook.weight = mx.zeros_like(sel.successor_codebook.weight)
        self.reference, self.prompt_len, self.schedule, self.vocab = reference, prompt_len, schedule, vocab
        self.cycle = 0

    def draft(self, block_ids, features, cache, target):
        hidden, _ = super().draft(block_ids, features, cache, target)
        generated = cache[0].offset - self.prompt_len + 1  # committed tokens after the prompt
        B = block_ids.shape[1]
        wanted = list(self.reference[generated : generated + B - 1])
        bad = self.schedule(self.cycle)
        if bad < len(wanted):
            wanted[bad] = (wanted[bad] + 1) % self.vocab
        self.cycle += 1
        logits = 10.0 * (mx.arange(self.vocab)[None, :] == mx.array(wanted)[:, None]).astype(mx.float32)
        return hidden, logits


def assert_window_wrap_matches_uncached(target, n_tokens: int) -> None:
    """Through wrapped ring caches (blocks and single rows) the logits match one
    uncached forward over the whole sequence with the model's window mask."""
    target.max_block = 4
    ids = [int(x) for x in np.random.RandomState(3).randint(0, 380, n_tokens)]
    ref = np.array(target.model(mx.array([ids])))
    cache, rows, i = target.make_cache(), [], 0
    for L in [20, 1, 3, 5, 2, 1, 4] * 10:
        if i >= len(ids):
            break
        rows.append(target(mx.array([ids[i : i + L]]), cache)[0])
        i += L
    assert cache[0].offset == len(ids) > cache[0].capacity
    np.testing.assert_allclose(np.array(mx.concatenate(rows, axis=1)), ref, atol=2e-5, rtol=1e-5)


def assert_blocks_bitwise_single_steps(target, n_tokens: int) -> None:
    """Blocks of 3 (after a prefill of 5) give bitwise the logits of one token
    at a time: the ground greedy parity stands on."""
    target.max_block = 4
    ids = [int(x) for x in np.random.RandomState(0).randint(0, 380, n_tokens)]
    c_block, c_step = target.make_cache(), target.make_cache()
    block = [target(mx.array([ids[:5]]), c_block)[0][:, -1:]]
    step = [target(mx.array([ids[:5]]), c_step)[0][:, -1:]]
    block += [target(mx.array([ids[i : i + 3]]), c_block)[0] for i in range(5, len(ids), 3)]
    step += [target(mx.array([[t]]), c_step)[0] for t in ids[5:]]
    assert np.array_equal(np.array(mx.concatenate(block, 1)), np.array(mx.concatenate(step, 1)))


def mlx_lm_distribution(logits, sampling) -> np.ndarray:
    """The distribution mlx-lm samples the next token from, for logits [..., V]
    and a `SamplingParams`-like `sampling` (temperature > 0, top_p, min_p, top_k).

    Built from `mlx_lm.sample_utils` alone, exactly as `make_sampler(temp, top_p,
    min_p, top_k=top_k)` composes it in `generate_step`: log-softmax of the
    logits, then top-p, min-p, top-k (each only when on, as make_sampler turns
    them on), then `categorical_sampling`'s logprobs * (1 / temp). Nothing here
    comes from dflash2_mlx.engine.sampling: it is the reference that code is
    tested against. Returned as float64 probabilities (zero where filtered).
    """
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    temp, top_p, min_p, top_k = sampling.temperature, sampling.top_p, sampling.min_p, sampling.top_k
    assert temp > 0, "greedy decoding has no distribution"
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    if 0 < top_p < 1.0:
        logprobs = apply_top_p(logprobs, top_p)
    if min_p != 0.0:
        logprobs = apply_min_p(logprobs, min_p)
    if top_k > 0:
        logprobs = apply_top_k(logprobs, top_k)
    return np.array(mx.softmax(logprobs * (1.0 / temp), axis=-1, precise=True), dtype=np.float64)


def mlx_lm_sampler(sampling):
    """mlx-lm's own sampler for the same settings (ids only), to check
    `mlx_lm_distribution` against what mlx-lm actually draws."""
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(sampling.temperature, top_p=sampling.top_p, min_p=sampling.min_p, top_k=sampling.top_k)


def node_ranks(tree, cand) -> list[int]:
    """Each draft-tree node's candidate index at its position (0 = the drafter's
    best there; the anchor 0): which branch a walk took."""
    return [0] + [list(cand[tree.depth[j] - 1]).index(tree.tokens[j]) for j in range(1, tree.rows)]
