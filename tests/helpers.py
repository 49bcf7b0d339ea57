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
def target_folder(family: str = "qwen3", quantize_bits=None, tie: bool = True, dtype: str = "float32") -> Path:
    folder = _ROOT / (f"target-{family}-{quantize_bits}-{tie}" + ("" if dtype == "float32" else f"-{dtype}"))
    if not folder.exists():
        write_target(folder, family, quantize_bits=quantize_bits, tie_word_embeddings=tie, dtype=getattr(mx, dtype))
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


def decode_steps(prompt, pair, request=None, *, policy=None, tokenizer=None, tree_only=False, **loop):
    """The decode loop (`generate_step`) on `pair` for `request` (default: greedy, 256
    tokens, the drafter's fixed block): its plan, with `policy` in place of the plan's
    block policy when given (`tokenizer`: for a grammar; `tree_only`: a sampled tree request
    verifies its tree every cycle, as a test of the tree's own rule needs, instead of
    measuring it against the chain). `loop`: generate_step's prompt_cache, profiler,
    prompt_progress_callback."""
    from dataclasses import replace

    from dflash2_mlx.engine.decode.loop import generate_step
    from dflash2_mlx.engine.plan import plan
    from dflash2_mlx.engine.request import DecodeRequest

    request = DecodeRequest(block_size=None) if request is None else request
    ids = [int(t) for t in np.array(prompt).reshape(-1)]
    history = 0
    if loop.get("prompt_cache") is not None:
        history = max(len(loop["prompt_cache"].tokens) - 1, 0)
    decode = plan(pair, request, prompt_ids=ids, history=history, tokenizer=tokenizer)
    if policy is not None:
        decode = replace(decode, policy=policy)
    if tree_only:
        decode = replace(decode, shape=None)
    return generate_step(prompt, pair, decode, **loop)


def ar_tokens(target, prompt, n):
    from dflash2_mlx.engine.request import DecodeRequest

    return [s.tokens[0] for s in decode_steps(prompt, Pair.make(target), DecodeRequest(max_tokens=n))]


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


def run_beside_companions(pair, prompt, plans: list, companions: int = 2, companion_tokens: int = 400):
    """Run one sequence per entry of `plans` (each a batched `DecodePlan` for `prompt`)
    in one `BatchDecoder`, joined after `companions` greedy sequences with other prompts and
    blocks are already decoding, so their cycles share passes with them (and with each other).

    Returns (each sequence's tokens, its steps, the fewest sequences any pass of one of their
    cycles held, read from the decoder's pass records)."""
    from dflash2_mlx.engine.batch.decoder import BatchDecoder
    from dflash2_mlx.engine.plan import plan
    from dflash2_mlx.engine.request import DecodeRequest

    decoder = BatchDecoder(pair, max_batch=len(plans) + companions)
    others = []
    for j in range(companions):
        ids = [2, 3, 4, 1, 6, 5, 7][: 3 + j]
        companion = plan(pair, DecodeRequest(max_tokens=companion_tokens, block_size=3 + j), prompt_ids=ids,
                         batched=True)
        others.append(decoder.add(ids, companion))
    while any(not c.running for c in others):
        decoder.step()
    seqs = [decoder.add(prompt, p) for p in plans]
    tokens, steps = {id(s): [] for s in seqs}, {id(s): [] for s in seqs}
    fewest = None
    while any(not s.finished for s in seqs):
        for seq, st in decoder.step():
            if id(seq) in tokens:
                if steps[id(seq)]:  # past its first token (the prefill's): a cycle in this step's pass
                    fewest = decoder.last_pass[0] if fewest is None else min(fewest, decoder.last_pass[0])
                tokens[id(seq)].extend(st.tokens)
                steps[id(seq)].append(st)
    assert all(c.running for c in others), "a companion finished before the sequences it was to run beside"
    return [tokens[id(s)] for s in seqs], [steps[id(s)] for s in seqs], fewest


PIT_BINS = 10


def pick_pvalues(picks, seed: int = 0) -> tuple[float, float]:
    """Two chi-square p-values that draws `picks` [(token, p row [V])], each said to come from
    its own row's p (the rows may all differ), really do: randomized PIT values
    u = F(x - 1) + v p(x) (uniform whatever the rows) on PIT_BINS equal bins, and each token's
    count against the sum of its p over the picks (tokens expecting under 5 left out;
    conservative: a sum of Bernoullis varies less than a Poisson count)."""
    from scipy.stats import chisquare

    rng = np.random.RandomState(seed)
    assert all(p[x] > 0 for x, p in picks), "a pick outside its row's support"
    u = np.array([p[:x].sum() + rng.uniform() * p[x] for x, p in picks])
    pit = chisquare(np.bincount(np.minimum((u * PIT_BINS).astype(int), PIT_BINS - 1), minlength=PIT_BINS)).pvalue
    expected = np.sum([p for _, p in picks], axis=0)
    observed = np.bincount([x for x, _ in picks], minlength=expected.size).astype(float)
    keep = expected >= 5
    assert keep.sum() >= 2, "too few tokens expect 5 picks: no count test"
    counts = chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue
    return pit, counts
