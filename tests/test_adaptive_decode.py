"""The decode loop under a changing block size: plain steps and speculative
cycles through the same caches stay exact and keep the caches level."""

import json

import mlx.core as mx
import pytest

from dflash2_mlx.engine.adaptive.policy import AcceptanceEstimate, BlockPolicy, CostTable, Decision
from dflash2_mlx.engine.adaptive.calibrate import calibration_key, load_or_calibrate, long_contexts
from dflash2_mlx.engine.adaptive.costs import non_decreasing as _non_decreasing
from dflash2_mlx.engine.decode.loop import DecodeCache, prefill
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams

from helpers import ar_tokens, decode_steps, load_pair_for

PROMPT = [5, 17, 42, 9, 100, 3, 77, 12]


class Schedule:
    """A policy that plays back block sizes (cycling), recording what it saw."""

    def __init__(self, sizes):
        self.sizes, self.i, self.observed, self.contexts = sizes, 0, [], []

    def choose(self, tokens_left, context=None):
        self.contexts.append(context)
        B = self.sizes[self.i % len(self.sizes)]
        return Decision(1 if B == 1 else max(2, min(B, tokens_left + 1)))

    def record(self, decision):
        self.i += 1

    def observe(self, drafted, accepted):
        self.observed.append((drafted, accepted))


@pytest.fixture(scope="module")
def pair():
    target, _, drafter = load_pair_for("qwen3", "dflash2")
    return Pair.make(target, drafter)


@pytest.mark.parametrize("sizes", [[1], [1, 1, 4], [3, 1, 1, 1, 16, 1, 2], [16, 1]])
def test_greedy_output_equals_plain_decoding(pair, sizes):
    n = 40
    policy = Schedule(sizes)
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    steps = list(decode_steps(PROMPT, pair, DecodeRequest(max_tokens=n, block_size=None), policy=policy,
                              prompt_cache=cache))
    tokens = [t for s in steps for t in s.tokens]
    assert tokens == ar_tokens(pair.target, PROMPT, n)
    # Plain steps draft nothing; every cycle's outcome reached the policy.
    assert sum(s.drafted > 0 for s in steps) == len(policy.observed)
    # At rest both caches hold every committed token but the last.
    assert cache.target[0].offset == len(cache.tokens) - 1 == cache.drafter_rows
    # Rows the target ran: one per plain step, the block per cycle (τ per verify row reads them).
    assert all(s.verify_rows == s.drafted + 1 for s in steps[1:])
    # Every decision is told the context it reads: the tokens committed so far (a plain
    # step's decision comes before its token is fetched: one fewer).
    committed = [len(PROMPT) + sum(len(s.tokens) for s in steps[:i]) for i in range(1, len(steps))]
    assert len(policy.contexts) == len(committed)
    assert all(c in (k, k - 1) for c, k in zip(policy.contexts, committed)), (policy.contexts, committed)


def test_plain_rows_reach_the_drafter_cache_before_the_next_draft(pair):
    # Drafting after a plain run sees exactly what a fixed-block run would:
    # the same drafter cache contents give the same drafts. A run leaves its
    # last plain rows unread (DecodeCache.unread); whoever drafts next runs them in.
    n = 30
    cache_a = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    list(decode_steps(PROMPT, pair, DecodeRequest(max_tokens=n, block_size=None), policy=Schedule([1]),
                      prompt_cache=cache_a))
    cache_b = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    list(decode_steps(PROMPT, pair, DecodeRequest(max_tokens=n, block_size=4), prompt_cache=cache_b))
    assert cache_a.unread is not None and cache_a.drafter[0].offset < cache_a.offset  # the premise: it lags
    for cache in (cache_a, cache_b):
        cache.catch_up(pair.drafter)
    for a, b in zip(cache_a.drafter, cache_b.drafter):
        ka, kb = a.state[0][..., : a.offset, :], b.state[0][..., : b.offset, :]
        assert a.offset == b.offset
        assert mx.allclose(ka, kb, atol=1e-5).item()


def test_a_next_turn_reads_its_prompt_after_the_rows_left_unread(pair):
    # A plain run leaves its rows unread; the next turn's prompt rows follow them,
    # so once read the drafter holds what reading the whole conversation at once gives it.
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    list(decode_steps(PROMPT, pair, DecodeRequest(max_tokens=20, block_size=None), policy=Schedule([1]),
                      prompt_cache=cache))
    assert cache.unread is not None  # the premise
    list(decode_steps([cache.tokens[-1], 5, 9, 2], pair, DecodeRequest(max_tokens=1, block_size=None),
                      prompt_cache=cache))
    read = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    prefill(mx.array(cache.tokens[:-1], dtype=mx.int32), pair, read)
    for c in (cache, read):
        c.catch_up(pair.drafter)
    for a, b in zip(cache.drafter, read.drafter):
        assert a.offset == b.offset == len(cache.tokens) - 1
        assert mx.allclose(a.state[0][..., : a.offset, :], b.state[0][..., : b.offset, :], atol=1e-4).item()


@pytest.mark.parametrize("stop_after", [1, 3, 7])
def test_closing_inside_a_plain_run_undoes_the_look_ahead(pair, stop_after):
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    gen = decode_steps(PROMPT, pair, DecodeRequest(max_tokens=50, block_size=None),
                       policy=Schedule([4, 1, 1, 1, 1, 1, 1, 1]), prompt_cache=cache)
    for i, _ in enumerate(gen):
        if i == stop_after:
            break
    gen.close()
    assert cache.target[0].offset == len(cache.tokens) - 1 == cache.drafter_rows
    # The cache continues exactly: the rest equals plain decoding.
    more = [t for s in decode_steps([cache.tokens[-1]], pair, DecodeRequest(max_tokens=10, block_size=3),
                                     prompt_cache=cache) for t in s.tokens]
    assert cache.tokens[len(PROMPT):] == ar_tokens(pair.target, PROMPT, len(cache.tokens) - len(PROMPT))
    assert len(more) == 10


def test_sampling_runs_and_repeats_with_a_seed(pair):
    sampling = SamplingParams(temperature=1.0, seed=3)

    def run():
        request = DecodeRequest(max_tokens=30, sampling=sampling, block_size=None)
        return [t for s in decode_steps(PROMPT, pair, request, policy=Schedule([1, 1, 4, 2])) for t in s.tokens]

    a, b = run(), run()
    assert a == b and len(a) == 30


def test_compute_bound_costs_decode_plainly(pair):
    costs = CostTable(1.0, {2: 1.6, 16: 9.4}, {2: 0.9, 16: 1.9})
    policy = BlockPolicy(costs, pair.max_block_size, AcceptanceEstimate(pair.max_block_size - 1, [0.3]))
    steps = list(decode_steps(PROMPT, pair, DecodeRequest(max_tokens=40, block_size=None), policy=policy))
    assert [t for s in steps for t in s.tokens] == ar_tokens(pair.target, PROMPT, 40)
    assert policy.report.fallbacks and policy.report.fallbacks[0][0] == 0
    assert sum(s.drafted > 0 for s in steps) == policy.report.probes


def test_calibration_measures_long_contexts_within_the_target():
    # A long-context target: 2,048 and 8,192 (32k is then a 4-fold extension, not 17-fold).
    assert long_contexts(32768, 256) == [2048, 8192] and long_contexts(None, 256) == [2048, 8192]
    assert long_contexts(2048, 8) == [1024]  # half the target's context at most ...
    assert long_contexts(6000, 8) == [2048]  # ... and not 3,000: too close to 2,048 to add anything
    assert long_contexts(2048, 300) == []  # not well past the prompt: the short table says it all


def test_calibration_is_cached_per_key(pair, tmp_path):
    first = load_or_calibrate(pair, tmp_path, PROMPT)
    assert not first.cached and first.path.exists()
    record = json.loads(first.path.read_text())
    assert record["key"] == calibration_key(pair)
    # Measured after the prompt and after a long context (half the target's 2,048 positions).
    contexts = first.costs.contexts
    assert list(contexts) == [len(PROMPT), 1024]
    for table in contexts.values():
        assert set(table.cycles) >= {2, pair.max_block_size}
        assert all(v > 0 for v in table.cycles.values()) and table.plain > 0
    # The batch costs: a target pass by total rows, and what a block adds per context token.
    batch = first.batch
    assert set(batch.target) == {1, 2, 4, 8, 16, 32, 64} and all(s > 0 for s in batch.target.values())
    assert batch.context_from == len(PROMPT) and {1, 2, pair.max_block_size} <= set(batch.per_context)
    assert all(s >= 0 for s in batch.per_context.values()) and record["batch"]["target_s"]
    again = load_or_calibrate(pair, tmp_path, PROMPT, check=False)
    assert again.cached and again.costs == first.costs and again.batch == first.batch
    # Another key (here: another backend name) is another file, measured anew.
    key = dict(calibration_key(pair), backend="elsewhere")
    assert key != record["key"]
    assert load_or_calibrate(pair, tmp_path, PROMPT, recalibrate=True).cached is False


def test_cycle_costs_are_made_non_decreasing():
    assert _non_decreasing({2: 1.0, 4: 3.0, 8: 2.0, 16: 5.0}) == {2: 1.0, 4: 2.5, 8: 2.5, 16: 5.0}
    assert _non_decreasing({2: 1.0, 4: 2.0}) == {2: 1.0, 4: 2.0}


def test_seeded_auto_repeats_whatever_the_clock_says(monkeypatch):
    """With a seed, `auto`'s schedule does not follow the clock, so three runs
    whose clocks disagree wildly give the same tokens (and the schedule still
    mixes plain steps and cycles, so the test is not vacuous)."""
    import random
    import types

    import dflash2_mlx.engine.plan as planning
    from dflash2_mlx import load_pair, stream_generate
    from dflash2_mlx.engine.adaptive.calibrate import Calibration

    pair, tokenizer = load_pair("builtin", "builtin")
    calibration = Calibration(CostTable(1.0, {2: 1.3, 16: 4.0}, {2: 0.1, 16: 0.3}), [0.6, 0.5, 0.4], key={})
    runs = []
    for i in range(3):
        rng, now = random.Random(i), [0.0]

        def perf_counter(rng=rng, now=now):
            now[0] += rng.uniform(0.1, 3.0)  # a machine whose speed changes all the time
            return now[0]

        monkeypatch.setattr(planning, "time", types.SimpleNamespace(perf_counter=perf_counter))  # the policy's clock
        request = DecodeRequest(max_tokens=80, block_size="auto", sampling=SamplingParams(temperature=0.9, seed=7))
        out = list(stream_generate(pair, tokenizer, "def fib(n):", request, calibration=calibration))
        runs.append(([r.token for r in out], out[-1].stats.block_sizes))
    assert runs[0][0] == runs[1][0] == runs[2][0]
    assert 1 in runs[0][1] and any(B > 1 for B in runs[0][1])


class TrueCosts:
    """A policy wrapper whose clock advances by what each decision really
    costs (`plain` per plain step, `cycle(B)` per cycle), charged when the next
    decision is recorded, as a real clock would be read."""

    def __init__(self, policy, plain, cycle):
        self.policy, self.plain, self.cycle = policy, plain, cycle
        self.now, self.blocks, self._pending = 0.0, [], None
        policy.clock = lambda: self.now

    def choose(self, tokens_left, context=None):
        return self.policy.choose(tokens_left)

    def record(self, decision):
        if self._pending is not None:
            self.now += self.plain if self._pending == 1 else self.cycle(self._pending)
        self._pending = decision.block
        self.blocks.append(decision.block)
        self.policy.record(decision)

    def observe(self, drafted, accepted):
        self.policy.observe(drafted, accepted)


@pytest.fixture(scope="module")
def builtin():
    from dflash2_mlx import load_pair

    return load_pair("builtin", "builtin")


@pytest.mark.parametrize("wrong, truth", [
    (2.5, "plain"),  # calibrated while busy: plain looked 2.5x slower than it is; drafting really loses
    (0.4, "draft"),  # plain looked 2.5x faster than it is; drafting really wins
])
def test_a_wrong_calibration_is_corrected_within_a_few_cycles(builtin, wrong, truth):
    pair, tokenizer = builtin
    ids = tokenizer.encode("class Stack:\n    def __init__(self):\n")
    if truth == "plain":
        true_cycle = lambda B: 1.0 + 0.9 * B  # compute-bound: a B-row pass costs about B plain steps
    else:
        true_cycle = lambda B: 1.0 + 0.05 * B  # a GPU: a small block costs little more than one row
    verify = {B: true_cycle(B) for B in (2, 4, 8, 16)}
    calibrated = CostTable(1.0 * wrong, verify, {B: 0.0 for B in verify})
    policy = BlockPolicy(calibrated, 16, AcceptanceEstimate(15, seed=[0.6, 0.5, 0.4]))
    timed = TrueCosts(policy, 1.0, true_cycle)
    n = 160
    request = DecodeRequest(max_tokens=n, block_size=None)
    tokens = [t for s in decode_steps(ids, pair, request, policy=timed) for t in s.tokens]
    assert tokens == ar_tokens(pair.target, ids, n)  # token-identical throughout
    first_choice, late = timed.blocks[0], timed.blocks[-20:]
    if truth == "plain":
        assert first_choice > 1  # the wrong calibration made drafting look better ...
        assert sum(B == 1 for B in late) >= 18  # ... and the run went back to plain decoding
        # It fell back after a few cycles (the first re-timing of plain decoding).
        assert policy.report.fallbacks and policy.report.fallbacks[0][0] <= 16, timed.blocks[:20]
    else:
        assert first_choice == 1  # the wrong calibration made plain decoding look better ...
        assert sum(B > 1 for B in late) >= 15  # ... and the run went back to drafting
        switch = next(i for i, B in enumerate(timed.blocks) if B > 1)
        assert switch <= 12, f"still plain after {switch} decisions: {timed.blocks[:20]}"


@pytest.mark.parametrize("wrong", [10.0, 0.1])
def test_a_cached_calibration_that_disagrees_with_the_machine_is_rescaled(pair, tmp_path, wrong):
    # Far enough off (10x) that no load on the machine running the suite hides it.
    first = load_or_calibrate(pair, tmp_path, PROMPT, check=False)
    record = json.loads(first.path.read_text())
    tables = record["costs"]["by_context"]
    for c, table in tables.items():
        tables[c] = {k: (v * wrong if isinstance(v, float) else {B: s * wrong for B, s in v.items()})
                     for k, v in table.items()}
    first.path.write_text(json.dumps(record))
    checked = load_or_calibrate(pair, tmp_path, PROMPT)
    assert checked.cached and checked.rescaled is not None
    assert (checked.rescaled < 1) == (wrong > 1)  # the file's times are scaled back towards the machine's
    for c, table in tables.items():  # every context's costs, by the same factor
        now = checked.costs.contexts[int(c)]
        assert now.plain == pytest.approx(table["plain_s"] * checked.rescaled)
        assert now.cycle(4) == pytest.approx(table["cycle_s"]["4"] * checked.rescaled)
    saved = json.loads(first.path.read_text())["costs"]["by_context"]
    assert {int(c): t["plain_s"] for c, t in saved.items()} == pytest.approx(
        {c: t.plain for c, t in checked.costs.contexts.items()})  # and kept, so the next run agrees
    assert load_or_calibrate(pair, tmp_path, PROMPT, check=False).costs == checked.costs
