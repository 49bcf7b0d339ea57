"""The batch block policy (engine/adaptive/batch_policy.py) on injected cost tables, and the
calibration's rows sweep on a tiny pair."""

import itertools
import random

import mlx.core as mx
import pytest

from dflash2_mlx.engine.adaptive.acceptance import AcceptanceEstimate
from dflash2_mlx.engine.adaptive.batch_policy import BatchCosts, BatchPolicy, SequenceView
from dflash2_mlx.engine.adaptive.calibrate import BATCH_ROWS, target_rows_costs
from dflash2_mlx.engine.adaptive.costs import non_decreasing as _non_decreasing
from dflash2_mlx.engine.adaptive.costs import ContextCosts, CostTable
from dflash2_mlx.engine.adaptive.policy import BlockPolicy

MS = 1e-3
ROWS = (1, 2, 4, 8, 16, 32, 64)
# A GPU-like machine: a pass over 64 rows costs 1.6x one row; the drafter's pass about 1 ms.
GPU = BatchCosts({R: (10 + 0.1 * (R - 1)) * MS for R in ROWS}, {2: 1.0 * MS, 4: 1.1 * MS, 8: 1.3 * MS, 16: 1.7 * MS})
# This CPU: a pass costs a fixed part (reading the weights) plus about as much again per two rows.
LINEAR = BatchCosts({R: (8 + 2 * R) * MS for R in ROWS}, {2: 1.5 * MS, 16: 5 * MS})
# In between: rows cost a tenth of a one-row pass each.
MIDDLE = BatchCosts({R: (10 + R) * MS for R in ROWS}, {2: 1.2 * MS, 16: 2.6 * MS})


def seq(alpha, tokens_left=100, max_block=16, fixed=None, context=100):
    return SequenceView(tokens_left, context, max_block, AcceptanceEstimate(15, [alpha]), fixed)


def plain_rate(policy, seqs):
    return policy.rate(seqs, [s.fixed or 1 for s in seqs])


@pytest.mark.parametrize("max_block", [4, 16])
def test_one_sequence_chooses_what_block_policy_would(max_block):
    rng = random.Random(0)
    drafted = plained = 0
    for _ in range(200):
        plain = rng.uniform(2, 20) * MS
        slope, intercept = rng.uniform(0.02, 1.5) * plain, rng.uniform(0, 0.5) * plain
        verify = {B: plain + slope * (B - 1) for B in (2, 4, 8, 16)}
        draft = {B: intercept + rng.uniform(0, 0.05) * plain * B for B in (2, 4, 8, 16)}
        alpha = rng.uniform(0.05, 0.98)
        block = BlockPolicy(CostTable(plain, verify, draft), max_block,
                            AcceptanceEstimate(max_block - 1, [alpha])).choose(100).block
        batch = BatchPolicy(BatchCosts({1: plain, **verify}, draft))
        assert batch.choose([seq(alpha, max_block=max_block)]) == [block]
        drafted, plained = drafted + (block > 1), plained + (block == 1)
    assert drafted > 20 and plained > 20  # both answers were asked for


def test_one_sequence_at_a_long_context_chooses_what_block_policy_would_there():
    """BlockPolicy interpolates its tables in the context; the batch costs hold the short
    table and what each block adds per context token: the same costs, the same answer."""
    rng = random.Random(2)
    drafted = plained = 0
    for _ in range(200):
        short_c, long_c = 100, 2048
        plain = rng.uniform(2, 20) * MS
        verify = {B: plain + rng.uniform(0.02, 0.5) * plain * (B - 1) for B in (2, 4, 8, 16)}
        draft = {B: rng.uniform(0, 0.3) * plain + 0.01 * plain * B for B in (2, 4, 8, 16)}
        grow = {B: rng.uniform(0, 3) * (1 + rng.uniform(0, 0.3) * B) for B in (1, 2, 4, 8, 16)}  # x at long_c
        long = CostTable(plain * grow[1] + plain, {B: v + plain * grow[B] for B, v in verify.items()}, draft)
        per = {B: plain * g / (long_c - short_c) for B, g in grow.items()}
        context, alpha = rng.choice([50, 1000, 2048, 6000]), rng.uniform(0.2, 0.98)
        policy = BlockPolicy(ContextCosts({short_c: CostTable(plain, verify, draft), long_c: long}), 16,
                             AcceptanceEstimate(15, [alpha]))
        block = policy.choose(100, context=context).block
        batch = BatchPolicy(BatchCosts({1: plain, **verify}, draft, per_context=per, context_from=short_c))
        assert batch.choose([seq(alpha, context=context)]) == [block]
        drafted, plained = drafted + (block > 1), plained + (block == 1)
    assert drafted > 20 and plained > 20


def test_a_long_conversation_runs_plain_beside_a_short_one_that_drafts():
    # Every context token costs each row of its sequence 2 us (attention that grows with rows x context).
    costs = BatchCosts(MIDDLE.target, MIDDLE.draft, per_context={1: 0.002 * MS, 16: 0.032 * MS}, context_from=100)
    blocks = BatchPolicy(costs).choose([seq(0.7, context=100), seq(0.7, context=16000)])
    assert blocks[0] > 1 and blocks[1] == 1
    # Without the context costs both would draft.
    assert all(b > 1 for b in BatchPolicy(MIDDLE).choose([seq(0.7, context=100), seq(0.7, context=16000)]))


def test_where_a_pass_costs_about_the_same_at_any_size_everybody_drafts():
    seqs = [seq(a) for a in (0.8, 0.7, 0.75, 0.6, 0.85, 0.7, 0.65, 0.8)]
    blocks = BatchPolicy(GPU).choose(seqs)
    assert all(b >= 2 for b in blocks)
    assert BatchPolicy(GPU).rate(seqs, blocks) > 1.5 * plain_rate(BatchPolicy(GPU), seqs)


def test_where_a_pass_costs_by_its_rows_and_acceptance_is_poor_all_decode_plainly():
    seqs = [seq(0.3) for _ in range(8)]
    assert BatchPolicy(LINEAR).choose(seqs) == [1] * 8
    # One of them alone does draft on that table (so the rows, not the table, decide).
    assert BatchPolicy(LINEAR).choose(seqs[:1])[0] > 1 or BatchPolicy(LINEAR).choose([seq(0.8)])[0] > 1


def test_mixed_acceptance_the_good_drafter_drafts_and_the_poor_one_runs_plain():
    blocks = BatchPolicy(MIDDLE).choose([seq(0.9), seq(0.05), seq(0.9), seq(0.05)])
    assert blocks[0] >= 4 and blocks[2] >= 4 and blocks[1] == blocks[3] == 1


def test_sequences_that_pay_for_the_drafter_pass_only_together_draft_together():
    # The drafter's pass costs 5 ms however few rows it drafts; a row costs 0.5 ms.
    costs = BatchCosts({R: (10 + 0.5 * R) * MS for R in ROWS}, {2: 5 * MS, 16: 5.5 * MS})
    seqs = [seq(0.8), seq(0.8), seq(0.8), seq(0.0), seq(0.0), seq(0.0)]
    policy = BatchPolicy(costs)
    plain = plain_rate(policy, seqs)
    # No sequence pays for it alone, nor does everybody drafting one block ...
    assert all(policy.rate(seqs, [b] + [1] * 5) <= plain for b in range(2, 17))
    assert all(policy.rate(seqs, [b] * 6) <= plain for b in range(2, 17))
    # ... but the three good drafters together do, by more than 10 %.
    blocks = policy.choose(seqs)
    assert all(b > 1 for b in blocks[:3]) and blocks[3:] == [1, 1, 1]
    assert policy.rate(seqs, blocks) > 1.1 * plain


def test_fixed_blocks_are_kept_and_the_others_still_choose():
    seqs = [seq(0.05, fixed=4), seq(0.95, fixed=1), seq(0.9), seq(0.9, max_block=1)]
    blocks = BatchPolicy(GPU).choose(seqs)
    assert blocks[:2] == [4, 1] and blocks[2] >= 4 and blocks[3] == 1
    # Only fixed sequences: their blocks as they are, whatever the costs say; nobody: nothing.
    assert BatchPolicy(LINEAR).choose(seqs[:2]) == [4, 1]
    assert BatchPolicy(LINEAR).choose([]) == []


def test_tokens_left_caps_blocks():
    blocks = BatchPolicy(GPU).choose([seq(0.99, tokens_left=3), seq(0.99, tokens_left=1), seq(0.99, tokens_left=100)])
    assert 2 <= blocks[0] <= 4 and blocks[1] == 1 and blocks[2] >= 8
    assert seq(0.99, tokens_left=3).top() == 4 and seq(0.99, tokens_left=3, max_block=2).top() == 2
    # E(b) is capped at tokens_left: a block past tokens_left + 1 would commit no more.
    assert seq(0.99, tokens_left=3).expected()[4] == 3.0


def test_the_choice_follows_the_load():
    policy = BatchPolicy(LINEAR)
    alone = [seq(0.8)]
    crowd = [seq(0.8) for _ in range(8)]
    assert policy.choose(alone)[0] > 1
    assert policy.choose(crowd) == [1] * 8
    assert policy.choose(alone)[0] > 1


def test_never_below_the_batch_decoding_plainly():
    """Random tables and batches: the choice's expected rate is at least all-plain's, and at
    least 0.97 of the best a brute-force search finds (small batches)."""
    rng = random.Random(1)
    for _ in range(300):
        fixed, slope, curve = rng.uniform(1, 20) * MS, rng.uniform(0.01, 5) * MS, rng.uniform(0, 0.05) * MS
        table = {R: fixed + slope * R + curve * R * R for R in ROWS}
        d0, dr = rng.uniform(0, 10) * MS, rng.uniform(0, 2) * MS
        costs = BatchCosts(table, {D: d0 + dr * D for D in (2, 4, 8, 16)}, rng.uniform(0, 3) * MS)
        seqs = [SequenceView(rng.randint(1, 8), 10, rng.randint(1, 6),
                             AcceptanceEstimate(5, [rng.uniform(0, 1) for _ in range(5)]))
                for _ in range(rng.randint(1, 3))]
        policy = BatchPolicy(costs)
        blocks = policy.choose(seqs)
        chosen, plain = policy.rate(seqs, blocks), plain_rate(policy, seqs)
        assert chosen >= plain
        assert blocks == [1] * len(seqs) or chosen > plain
        best = max(policy.rate(seqs, list(b)) for b in itertools.product(*(range(1, s.top() + 1) for s in seqs)))
        assert chosen >= 0.97 * best or chosen * (1 + policy.margin) >= best and blocks == [1] * len(seqs)


def test_starting_to_draft_needs_the_margin_keeping_on_does_not():
    # Two sequences at 0.3 on MIDDLE: drafting wins by less than the 3 % margin.
    seqs = [seq(0.3), seq(0.3)]
    policy = BatchPolicy(MIDDLE, margin=0.0)
    lead = policy.rate(seqs, policy.choose(seqs)) / plain_rate(policy, seqs)
    assert 1.0 < lead < 1.03
    fresh = BatchPolicy(MIDDLE)  # counts as drafting, as a fresh BlockPolicy does
    assert fresh.choose(seqs) != [1, 1]
    fresh.choose([seq(0.05), seq(0.05)])  # plain: now it must win by the margin to start again
    assert fresh.choose(seqs) == [1, 1]


def test_observed_passes_move_the_choice():
    t = [0.0]
    policy = BatchPolicy(GPU, clock=lambda: t[0])
    seqs = [seq(0.6) for _ in range(4)]
    blocks = policy.choose(seqs)
    assert all(b > 1 for b in blocks)
    # Drafting passes turn out four times dearer than calibrated (a drafter slower than measured).
    for _ in range(30):
        rows = sum(blocks)
        predicted = policy.pass_cost(rows, rows) / policy.scale["spec"]
        t[0] += 4 * predicted
        policy.observe_pass(rows, rows)
        blocks = policy.choose(seqs) if all(b > 1 for b in blocks) else blocks
    assert policy.choose(seqs) == [1] * 4 and policy.scale["spec"] > 3

    # The other way: on LINEAR eight sequences decode plainly, until passes that draft turn out cheap.
    crowd = [seq(0.8) for _ in range(8)]
    timed, blind = BatchPolicy(LINEAR, clock=lambda: 0.0), BatchPolicy(LINEAR)
    for policy in (timed, blind):
        assert policy.choose(crowd) == [1] * 8
        for _ in range(30):
            policy.observe_pass(16, 16, 0.25 * LINEAR.pass_cost(16, 16))
            policy.observe_pass(8, 0, LINEAR.pass_cost(8, 0))
    assert any(b > 1 for b in timed.choose(crowd))
    assert blind.choose(crowd) == [1] * 8  # without a clock the costs never move (seeded schedules)


def test_batch_costs_interpolate_extend_and_round_trip():
    costs = BatchCosts({1: 1.0, 2: 1.5, 64: 32.5}, {2: 0.5, 16: 1.2}, 0.1, {1: 0.01, 16: 0.16}, 100)
    assert costs.context_cost(4, 50) == 0.0 and costs.context_cost(4, 200) == pytest.approx(4.0)
    assert costs.draft_cost(0) == 0.0 and costs.draft_cost(9) == pytest.approx(0.85)
    assert costs.target_cost(128) == pytest.approx(64.5)  # extended linearly from the last two
    assert costs.pass_cost(4, 2) == pytest.approx(costs.target_cost(4) + 0.5 + 0.1)
    assert BatchCosts.from_dict(costs.to_dict()) == costs
    assert costs.scaled(2.0).pass_cost(4, 2) == pytest.approx(2 * costs.pass_cost(4, 2))
    assert costs.scaled(2.0).context_cost(4, 200) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        BatchCosts({}, {2: 1.0})
    # A pair without a drafter pass measured never drafts.
    assert BatchPolicy(BatchCosts({1: 1.0, 64: 1.1}, {})).choose([seq(0.99)]) == [1]


def test_a_calibration_without_the_rows_sweep_reads_its_short_table():
    from dflash2_mlx.engine.adaptive.calibrate import Calibration

    for alpha in (0.2, 0.9):
        cal = Calibration(CostTable(10 * MS, {2: 13 * MS, 16: 30 * MS}, {2: 1 * MS, 16: 3 * MS}), [alpha], key={})
        assert cal.batch is None
        assert cal.batch_policy().choose([seq(alpha)]) == [cal.policy(16).choose(100).block]
    assert cal.policy(16).choose(100).block > 1  # 0.9 drafts and 0.2 runs plain: both answers asked for


def test_calibration_rows_sweep_on_a_tiny_pair():
    from dflash2_mlx.engine.pair import Pair
    from helpers import load_pair_for

    target, _, drafter = load_pair_for("qwen3", "dflash2")
    pair = Pair.make(target, drafter)
    prompt = [5, 17, 42, 9, 100, 3, 77, 12]
    cache = pair.target.make_cache()
    table = target_rows_costs(pair, prompt, cache=cache, repeats=2)
    assert sorted(table) == list(BATCH_ROWS)
    assert all(s > 0 for s in table.values()) and table == _non_decreasing(table)
    assert table[64] > table[1]  # 64 rows cost more than one on any machine this runs on
    # Every pass was undone: the cache holds the prompt and nothing else.
    assert cache[0].offset == len(prompt)
    mx.eval([c.state for c in cache])
