"""Continuous batching with speculation (engine/batch, docs/batching.md).

Every sequence of a batch must decode exactly what it decodes alone: greedy
tokens identical, seeded samples identical, sampled tokens from the target's
own distribution; sequences join and leave mid-run, a long prompt's prefill
runs chunk by chunk between the others' cycles, and a sequence that leaves
keeps caches a later turn continues from.
"""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.batch.decoder import BatchDecoder, batch_blocker
from dflash2_mlx.engine.decode.loop import DecodeCache, prefill
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.plan import plan
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams
from dflash2_mlx.errors import DFlashError
from helpers import decode_steps, load_pair_for

STEP = 16  # prefill chunk: prompts of several chunks interleave with the others' cycles


def _pair(family):
    target, _, drafter = load_pair_for(family)
    return Pair.make(target, drafter)


def _requests(V, seed=0):
    """Prompts of different lengths (some past the sliding windows), each with its own
    block size (None: the drafter's; 1 in a pair without drafter), tree rows (0: the
    chain), length and sampling."""
    rng = np.random.default_rng(seed)
    lengths, blocks, tokens = (5, 37, 3, 60, 12, 24), (4, 16, 2, 8, None, 3), (20, 33, 12, 40, 25, 9)
    trees = (0, 0, 0, 8, 6, 0)
    return [dict(prompt=rng.integers(0, V, n).tolist(), block=b, max_tokens=m, tree=t)
            for n, b, m, t in zip(lengths, blocks, tokens, trees)]


def _alone(pair, r, sampling=SamplingParams(), **kw):
    request = DecodeRequest(max_tokens=r["max_tokens"], block_size=r["block"], prefill_step_size=STEP,
                            sampling=sampling, tree_rows=r.get("tree", 0))
    steps = decode_steps(r["prompt"], pair, request, **kw)
    return [t for s in steps for t in s.tokens]


def _plan(pair, prompt, *, policy=None, batch_decides=None, **request):
    """The batched plan of a request of `request` (block_size None: the drafter's fixed
    block) for `prompt`; `policy` and `batch_decides` in place of the plan's when given."""
    decode = plan(pair, DecodeRequest(**{"block_size": None, **request}), prompt_ids=prompt, batched=True)
    if policy is not None:
        decode = replace(decode, policy=policy)
    if batch_decides is not None:
        decode = replace(decode, batch_decides=batch_decides)
    return decode


def _run_batch(pair, requests, join_every=2, samplings=None, leave=None, max_batch=8):
    """Run `requests` through one decoder, one joining every `join_every` steps; `leave`:
    {index: tokens} removes that sequence once it has that many. Returns tokens per request
    and the decoder."""
    decoder = BatchDecoder(pair, max_batch=max_batch)
    waiting, got, seqs, step = list(enumerate(requests)), {}, {}, 0
    while waiting or decoder.sequences:
        if waiting and step % join_every == 0 and not decoder.full:
            i, r = waiting.pop(0)
            sampling = samplings[i] if samplings else SamplingParams()
            seqs[i] = decoder.add(r["prompt"], _plan(pair, r["prompt"], max_tokens=r["max_tokens"],
                                                     block_size=r["block"], sampling=sampling,
                                                     prefill_step_size=STEP, tree_rows=r.get("tree", 0)))
            got[i] = []
        for seq, s in decoder.step():
            i = next(k for k, v in seqs.items() if v is seq)
            got[i].extend(s.tokens)
        for i, seq in seqs.items():
            if seq in decoder.sequences and (seq.finished or (leave and i in leave and len(got[i]) >= leave[i])):
                decoder.remove(seq)
        step += 1
    return got, seqs, decoder


@pytest.mark.parametrize("family", ["qwen3", "llama", "muse_glimmer", "gemma3_text"])
def test_each_sequence_of_a_batch_is_token_identical_to_running_alone(family):
    pair = _pair(family)
    requests = _requests(pair.target.vocab_size)
    got, _, decoder = _run_batch(pair, requests)
    for i, r in enumerate(requests):
        assert got[i] == _alone(pair, r), f"sequence {i} (block {r['block']}, tree {r['tree']}) differs from alone"
    assert decoder.passes < sum(r["max_tokens"] for r in requests)  # passes were shared


def test_builtin_pair_batches_token_identically():
    from dflash2_mlx.loading.load_pair import load_pair

    pair, _ = load_pair("builtin", "builtin")
    requests = _requests(pair.target.vocab_size, seed=3)[:4]
    got, _, _ = _run_batch(pair, requests, join_every=1)
    for i, r in enumerate(requests):
        assert got[i] == _alone(pair, r)


def test_plain_sequences_batch_without_a_drafter():
    """Plain rows only: each pass is launched before the last one's tokens are fetched
    (ahead.py); sequences that join, leave early or sample with a seed decode as alone."""
    pair = _pair("qwen3").without_drafter()
    requests = [dict(r, block=None, tree=0) for r in _requests(pair.target.vocab_size, seed=1)]
    samplings = [SamplingParams(temperature=0.9, seed=7 + i) if i % 2 else SamplingParams()
                 for i in range(len(requests))]
    got, seqs, decoder = _run_batch(pair, requests, samplings=samplings, leave={1: 6, 2: 3}, join_every=3)
    for i, r in enumerate(requests):
        alone = _alone(pair, r, samplings[i])
        assert got[i] == (alone[: len(got[i])] if i in (1, 2) else alone), f"sequence {i}"
        cache = seqs[i].cache  # at rest: the look-ahead row of a sequence that left is taken back
        assert cache.target[0].offset == len(cache.tokens) - 1
    assert len(got[1]) < requests[1]["max_tokens"] and decoder.last_pass[1] == decoder.last_pass[0]


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_plain_passes_keep_the_batch_in_one_buffer_that_the_caches_hold_as_theirs(family, monkeypatch):
    """A run of one-row passes writes into one buffer per layer (plain_run.py): each
    sequence's cache holds its slot of it (no second copy), nothing is gathered again
    while the run lasts, and a sequence that leaves takes its rows back as its own."""
    from dflash2_mlx.engine.batch import plain_run

    gathers = []
    real_gather = plain_run._gather
    monkeypatch.setattr(plain_run, "_gather", lambda *a: gathers.append(1) or real_gather(*a))
    pair = _pair(family).without_drafter()
    requests = [dict(r, block=None, tree=0, max_tokens=30) for r in _requests(pair.target.vocab_size, seed=5)[:4]]
    decoder = BatchDecoder(pair, max_batch=4)
    seqs = [decoder.add(r["prompt"], _plan(pair, r["prompt"], max_tokens=r["max_tokens"], prefill_step_size=STEP))
            for r in requests]
    got = {id(s): [] for s in seqs}

    def step():
        for s, out in decoder.step():
            got[id(s)].extend(out.tokens)

    while any(s.anchor is None for s in seqs):
        step()
    step()  # the first pass of all four gathers their rows into the run's buffers
    held = sorted(decoder._run.layers)
    assert held and all(type(c) in plain_run.SLOT_CACHES for c in (seqs[0].cache.target[j] for j in held))
    gathers.clear()
    for _ in range(5):
        step()
    assert not gathers  # the same sequences: the buffer is written, never gathered again
    for j in held:
        batch = decoder._run.layers[j]
        assert all(s.cache.target[j].keys is k for s, k in zip(seqs, batch.keys))
    decoder.remove(seqs[0])
    assert not decoder._run.layers and all(seqs[0].cache.target[j].keys is not k
                                           for j in held for k in batch.keys + batch.values)
    while decoder.sequences:
        step()
        for s in seqs:
            if s.finished and s in decoder.sequences:
                decoder.remove(s)
    for s, r in zip(seqs[1:], requests[1:]):
        assert got[id(s)] == _alone(pair, r)
    assert got[id(seqs[0])] == _alone(pair, requests[0])[: len(got[id(seqs[0])])]


def test_seeded_sequences_sample_what_they_sample_alone_whoever_shares_the_batch():
    pair = _pair("qwen3")
    requests = _requests(pair.target.vocab_size, seed=2)
    samplings = [SamplingParams(temperature=0.9, top_p=0.95, seed=40 + i) for i in range(len(requests))]
    got, _, _ = _run_batch(pair, requests, samplings=samplings)
    # The same seeded request beside other companions: the same tokens again.
    others = _requests(pair.target.vocab_size, seed=9)
    again, _, _ = _run_batch(pair, [requests[1], *others[2:]], samplings=[samplings[1]] + [SamplingParams()] * 4,
                             join_every=1)
    for i, r in enumerate(requests):
        assert got[i] == _alone(pair, r, samplings[i]), f"seeded sequence {i}"
    assert again[0] == got[1]


def test_sequences_leave_mid_run_and_their_caches_continue_a_next_turn():
    pair = _pair("muse_glimmer")
    requests = _requests(pair.target.vocab_size, seed=4)
    got, seqs, _ = _run_batch(pair, requests, leave={1: 7, 3: 5})
    for i in (1, 3):  # cut off: a prefix of what it decodes alone, caches at rest
        assert got[i] == _alone(pair, requests[i])[: len(got[i])]
        cache = seqs[i].cache
        assert len(got[i]) >= 5 and cache.target[0].offset == len(cache.tokens) - 1
        assert cache.drafter_rows == len(cache.tokens) - 1 and all(c.offset == cache.drafter[0].offset for c in cache.drafter)
    # Continue sequence 1 from its caches (a next turn): as a fresh run over the whole history.
    cache = seqs[1].cache
    del cache.tokens[len(requests[1]["prompt"]) + len(got[1]):]
    cache.truncate(len(cache.tokens))
    # Its last rows wait unread (nothing ran them through the drafter when it left); run
    # in, the drafter holds what reading the whole history at once gives it.
    assert cache.unread is not None and cache.drafter_rows == len(cache.tokens) - 1
    cache.catch_up(pair.drafter)
    read = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    prefill(mx.array(cache.tokens[:-1], dtype=mx.int32), pair, read, STEP)
    read.catch_up(pair.drafter)
    for a, b in zip(cache.drafter, read.drafter):
        assert a.offset == b.offset == len(cache.tokens) - 1
        assert mx.allclose(a.state[0][..., : a.offset, :], b.state[0][..., : b.offset, :], atol=1e-4).item()
    turn = [cache.tokens[-1], 5, 9, 2]
    history = cache.tokens[:-1] + turn
    cont = [t for s in decode_steps(turn, pair, DecodeRequest(max_tokens=10, block_size=None), prompt_cache=cache)
            for t in s.tokens]
    assert cont == _alone(pair, dict(prompt=history, block=None, max_tokens=10))


def test_a_long_prompt_prefills_between_the_others_cycles():
    pair = _pair("qwen3")
    V = pair.target.vocab_size
    decoder = BatchDecoder(pair, max_batch=4)
    short = decoder.add(list(range(1, 9)), _plan(pair, list(range(1, 9)), max_tokens=60, prefill_step_size=STEP))
    decoder.step()  # its prefill
    prompt = np.random.default_rng(5).integers(0, V, 200).tolist()
    long = decoder.add(prompt, _plan(pair, prompt, max_tokens=4, prefill_step_size=STEP))
    while long.anchor is None:
        steps = dict((id(s), st) for s, st in decoder.step())
        assert id(short) in steps, "the running sequence waited for a whole prompt's prefill"
    # 200 tokens in chunks of 16: the short one ran a cycle beside every chunk.
    assert len(short.cache.tokens) - 8 >= 200 // STEP


def test_recurrent_targets_say_why_they_do_not_batch():
    pair = _pair("qwen3_5")
    why = batch_blocker(pair)
    assert why is not None and "recurrent" in why
    with pytest.raises(DFlashError, match="cannot batch"):
        BatchDecoder(pair)


def test_rules_of_each_row_hold_in_a_batch():
    """Penalties and log-probabilities per sequence, as alone."""
    from mlx_lm.sample_utils import make_logits_processors

    pair = _pair("qwen3")
    requests = _requests(pair.target.vocab_size, seed=6)[:3]
    decoder, got, seqs = BatchDecoder(pair), {}, []
    for r in requests:
        procs = make_logits_processors(repetition_penalty=1.3)
        seqs.append(decoder.add(r["prompt"], _plan(pair, r["prompt"], max_tokens=r["max_tokens"], block_size=r["block"],
                                                   logits_processors=procs, top_logprobs=2, prefill_step_size=STEP)))
    while any(not s.finished for s in seqs):
        for s, st in decoder.step():
            got.setdefault(id(s), []).extend(zip(st.tokens, [lp.logprob for lp in st.logprobs]))
    for r, s in zip(requests, seqs):
        request = DecodeRequest(max_tokens=r["max_tokens"], block_size=r["block"], prefill_step_size=STEP,
                                logits_processors=make_logits_processors(repetition_penalty=1.3), top_logprobs=2)
        alone = [(t, lp.logprob) for st in decode_steps(r["prompt"], pair, request)
                 for t, lp in zip(st.tokens, st.logprobs)]
        assert [t for t, _ in got[id(s)]] == [t for t, _ in alone]
        assert np.allclose([p for _, p in got[id(s)]], [p for _, p in alone], atol=1e-5)


@pytest.mark.slow
def test_batched_sampling_matches_the_target_distribution():
    """The first three tokens of sequences sampled eight at a time, joined beside two greedy
    companions (other prompts, other blocks) already decoding: chi-square against mlx-lm's
    exact distribution. The decoder's pass records show that every sampled cycle shared its
    pass with both companions."""
    from helpers import run_beside_companions
    from test_sampling import ALPHA, PROMPT, exact_distribution, gof_pvalue, tiny_drafter, tiny_target

    target, cfg = tiny_target()
    pair = Pair.make(target, tiny_drafter(cfg, "dflash2"))
    settings, n, counts = SamplingParams(temperature=1.0), 600, {}
    for first in range(0, n, 8):
        tokens, steps, fewest = run_beside_companions(pair, PROMPT, [
            _plan(pair, PROMPT, max_tokens=3, block_size=3, sampling=SamplingParams(settings.temperature, seed=seed))
            for seed in range(first, min(first + 8, n))])
        assert fewest >= 3, f"a sampled cycle ran in a pass of {fewest} sequences: not beside the companions"
        assert all(any(st.drafted for st in sts) for sts in steps)
        for toks in tokens:
            counts[tuple(toks[:3])] = counts.get(tuple(toks[:3]), 0) + 1
    p = gof_pvalue(counts, exact_distribution(target, settings), n=n)
    print(f"batched T=1: chi-square p = {p:.3g}")
    assert p > ALPHA, f"chi-square p = {p:.2e}"


def _policy_run(pair, costs, n, calibration_acceptance=(0.9, 0.8, 0.7)):
    """`n` auto sequences under a batch policy with `costs`; (tokens per sequence,
    blocks of each pass)."""
    from dflash2_mlx.engine.adaptive.acceptance import AcceptanceEstimate
    from dflash2_mlx.engine.adaptive.batch_policy import BatchPolicy
    from dflash2_mlx.engine.adaptive.policy import BlockPolicy

    requests = _requests(pair.target.vocab_size, seed=8)[:n]
    decoder, seqs, passes = BatchDecoder(pair, max_batch=8, policy=BatchPolicy(costs)), [], []
    B = pair.max_block_size
    for r in requests:
        own = BlockPolicy(_SOLO, B, AcceptanceEstimate(B - 1, list(calibration_acceptance)))
        seqs.append(decoder.add(r["prompt"], _plan(pair, r["prompt"], max_tokens=r["max_tokens"], policy=own,
                                                   batch_decides=True, prefill_step_size=STEP)))
    got = {id(s): [] for s in seqs}
    while any(not s.finished for s in seqs):
        before = decoder.passes
        for s, st in decoder.step():
            got[id(s)].extend(st.tokens)
        if decoder.passes > before:
            passes.append(list(decoder.last_blocks))
    for s, r in zip(seqs, requests):
        assert got[id(s)] == _alone(pair, dict(r, block=None, tree=0))
    return passes


MS = 1e-3
_ROWS = (1, 2, 4, 8, 16, 32, 64)


def _solo_costs():
    from dflash2_mlx.engine.adaptive.costs import CostTable

    return CostTable(10 * MS, {2: 11 * MS, 16: 12 * MS}, {2: 1 * MS, 16: 2 * MS})


_SOLO = _solo_costs()


def test_the_batch_policy_drafts_where_passes_are_cheap_and_decodes_plainly_where_rows_cost():
    """Same sequences, same tokens; a GPU-like table (a 64-row pass ~1.6x one row) has
    every sequence draft, a CPU-like one (cost linear in rows, poor acceptance) has the
    batch decode plainly."""
    from dflash2_mlx.engine.adaptive.batch_policy import BatchCosts

    pair = _pair("qwen3")
    gpu = BatchCosts({R: (10 + 0.1 * (R - 1)) * MS for R in _ROWS}, {2: 1 * MS, 16: 2 * MS})
    cpu = BatchCosts({R: 10 * R * MS for R in _ROWS}, {2: 5 * MS, 16: 40 * MS})
    drafted = _policy_run(pair, gpu, 4)
    plain = _policy_run(pair, cpu, 4, calibration_acceptance=(0.2, 0.05))
    assert all(b >= 2 for b in drafted[0]) and sum(max(p) > 1 for p in drafted) > len(drafted) // 2
    assert all(max(p) == 1 for p in plain)


def test_the_default_batch_is_what_the_caches_fit_in_a_quarter_of_the_memory():
    from dflash2_mlx.engine.batch.memory import DEFAULT_MOST, default_max_batch, sequence_cache_bytes

    pair = _pair("qwen3")
    one = sequence_cache_bytes(pair, 2048)  # the look-alike's context
    assert one > 0 and sequence_cache_bytes(pair, 4096) == 2 * one
    assert default_max_batch(pair, memory=4 * one * 3) == 3
    assert default_max_batch(pair, memory=one) == 1  # never below one request
    assert default_max_batch(pair, memory=1 << 50) == DEFAULT_MOST


def test_the_batch_policy_is_told_one_pass_time_per_pass_when_passes_run_ahead(monkeypatch):
    """A plain cycle that launches the next pass early (ahead.py) computes two passes (on the
    CPU the launch evaluates both), and the cycle that then runs that pass computes none. A
    clock that advances one pass's time per target pass built gives exactly that pattern:
    every time the policy is told must be one pass's. (Told the cycles' times as they came,
    it learned that plain passes cost twice what they do, and drafted where plain decoding
    was cheaper: `dflash2 serve` auto ran at 0.77x `--ar`.)"""
    import types

    import dflash2_mlx.engine.batch.ahead as ahead_module
    import dflash2_mlx.engine.batch.decoder as decoder_module
    from dflash2_mlx.engine.adaptive.acceptance import AcceptanceEstimate
    from dflash2_mlx.engine.adaptive.batch_policy import BatchCosts, BatchPolicy
    from dflash2_mlx.engine.adaptive.policy import BlockPolicy

    now, PASS = [0.0], 10 * MS
    real_pass = decoder_module.target_pass

    def timed_pass(pair, groups, *run):
        now[0] += PASS
        return real_pass(pair, groups, *run)

    monkeypatch.setattr(decoder_module, "target_pass", timed_pass)
    monkeypatch.setattr(ahead_module, "target_pass", timed_pass)
    monkeypatch.setattr(decoder_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    costs = BatchCosts({R: PASS for R in _ROWS}, {2: 100 * MS, 16: 800 * MS})  # drafting never pays
    policy, told = BatchPolicy(costs, clock=lambda: now[0]), []
    monkeypatch.setattr(policy, "observe_pass", lambda rows, drafted, seconds=None: told.append(seconds))
    pair = _pair("qwen3")
    decoder, B = BatchDecoder(pair, max_batch=8, policy=policy), pair.max_block_size
    seqs = [decoder.add(r["prompt"], _plan(
        pair, r["prompt"], max_tokens=r["max_tokens"], batch_decides=True, prefill_step_size=STEP,
        policy=BlockPolicy(_SOLO, B, AcceptanceEstimate(B - 1, [0.1])))) for r in _requests(pair.target.vocab_size)[:4]]
    launched = []
    real_launch = ahead_module.LookAhead.launch
    monkeypatch.setattr(ahead_module.LookAhead, "launch",
                        classmethod(lambda cls, *a: launched.append(1) or real_launch.__func__(cls, *a)))
    while any(not s.finished for s in seqs):
        decoder.step()
    assert len(launched) > 10, "no look-ahead ran: the test checks nothing"
    assert len(told) > 20 and all(t == pytest.approx(PASS) for t in told), sorted(set(round(t / MS, 3) for t in told))
