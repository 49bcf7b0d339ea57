"""The block-size policy against injected cost tables and scripted acceptance.

Acceptance is simulated: a cycle at block size B accepts the leading run of
B - 1 Bernoulli draws with the given per-position rates (seeded), which is
what a drafter with those conditional acceptance rates does.
"""

import random

import pytest

from dflash2_mlx.engine.adaptive.policy import AcceptanceEstimate, BlockPolicy, CostTable


def decide(policy, tokens_left):
    """What the decode loop does before each cycle: choose, then act on the choice."""
    decision = policy.choose(tokens_left)
    policy.record(decision)
    return decision.block


def test_choosing_changes_nothing():
    # Asking is not deciding: the same question twice gets the same answer.
    costs = CostTable(1.0, {2: 3.0, 4: 6.0}, {2: 0.0, 4: 0.0})
    policy = BlockPolicy(costs, 4, AcceptanceEstimate(3, seed=[0.3]))
    first = policy.choose(50)
    assert policy.choose(50) == first and policy.report.fallbacks == [] and policy.tokens == 0
    policy.record(first)
    assert first.block == 1 and policy.report.fallbacks and policy.tokens == 1
    assert policy.mode is first.mode


def accepted_run(rng, alphas, drafted):
    a = 0
    while a < drafted and rng.random() < alphas[a]:
        a += 1
    return a


def simulate(policy, costs, alphas, tokens, seed=0, switch=None):
    """Decode `tokens` tokens under `policy`; returns (seconds, blocks chosen).

    `switch` = (token index, new alphas) changes the acceptance mid-run.
    """
    rng, done, seconds, blocks = random.Random(seed), 0, 0.0, []
    while done < tokens:
        if switch and done >= switch[0]:
            alphas = switch[1]
        B = decide(policy, tokens - done)
        blocks.append(B)
        if B == 1:
            seconds += costs.plain
            done += 1
            continue
        a = accepted_run(rng, alphas, B - 1)
        policy.observe(B - 1, a)
        seconds += costs.cycle(B)
        done += a + 1
    return seconds, blocks


def expected_tokens(alphas, B):
    total, run = 1.0, 1.0
    for alpha in alphas[: B - 1]:
        run *= alpha
        total += run
    return total


def best_fixed_rate(costs, alphas, max_block):
    """Tokens per second of the best fixed block size, from the true rates."""
    return max(expected_tokens(alphas, B) / costs.cycle(B) for B in range(2, max_block + 1))


def test_interpolation_between_measured_sizes():
    costs = CostTable(1.0, {2: 2.0, 4: 3.0, 16: 9.0}, {2: 0.5, 16: 0.5})
    assert costs.cycle(3) == pytest.approx(2.5 + 0.5)
    assert costs.cycle(10) == pytest.approx(6.0 + 0.5)
    assert CostTable.from_dict(costs.to_dict()) == costs


def test_expected_tokens_from_rates():
    est = AcceptanceEstimate(3, seed=[0.5, 0.5, 0.5])
    assert est.expected_tokens(4) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    # A rejected first position is evidence about position 0 only.
    est.observe(drafted=3, accepted=0)
    assert est.rates[0] < 0.5 and est.rates[1:] == pytest.approx([0.5, 0.5])


def test_flat_verify_cost_picks_long_blocks():
    # A machine where verification is nearly free: verify cost flat in rows.
    costs = CostTable(1.0, {2: 1.05, 16: 1.05}, {2: 0.25, 16: 0.25})
    alphas = [0.8] * 15
    policy = BlockPolicy(costs, 16, AcceptanceEstimate(15, seed=[0.6]))
    seconds, blocks = simulate(policy, costs, alphas, 3000)
    spec = [B for B in blocks if B > 1]
    assert 1 not in blocks
    # The best expected block here is the longest one.
    assert max(range(2, 17), key=lambda B: expected_tokens(alphas, B) / costs.cycle(B)) == 16
    assert sum(B == 16 for B in spec) / len(spec) > 0.9
    assert 3000 / seconds >= 0.9 * best_fixed_rate(costs, alphas, 16)


def test_interior_optimum_reaches_best_fixed_rate():
    # Verify cost rising in rows: the best block is in between.
    costs = CostTable(1.0, {1: 1.0, 16: 1.0 + 0.12 * 15}, {2: 0.3, 16: 0.45})
    alphas = [0.75] * 15
    rates = {B: expected_tokens(alphas, B) / costs.cycle(B) for B in range(2, 17)}
    best = max(rates, key=rates.get)
    assert 2 < best < 16
    policy = BlockPolicy(costs, 16, AcceptanceEstimate(15, seed=[0.5]))
    seconds, blocks = simulate(policy, costs, alphas, 4000, seed=1)
    assert 4000 / seconds >= 0.9 * rates[best]
    late = [B for B in blocks[len(blocks) // 2:]]
    assert abs(sorted(late)[len(late) // 2] - best) <= 2


def test_compute_bound_machine_falls_back_with_a_reason():
    # This CPU's shape: a 4-row verify costs 2.8 plain steps, acceptance about 0.46.
    costs = CostTable(1.0, {2: 1.6, 4: 2.8, 8: 5.2, 16: 9.4}, {2: 0.9, 4: 1.0, 16: 1.9})
    alphas = [0.46] * 15
    policy = BlockPolicy(costs, 16, AcceptanceEstimate(15, seed=[0.46] * 3))
    seconds, blocks = simulate(policy, costs, alphas, 2000, seed=2)
    assert blocks[0] == 1  # no block beats plain from the start
    token, why = policy.report.fallbacks[0]
    assert token == 0 and "plain decoding" in why
    # Probes continue, rarely enough that auto stays within 5 % of plain decoding.
    assert 0 < policy.report.probes < 40
    assert 2000 / seconds >= 0.95 / costs.plain


def test_probes_back_off_while_they_lose_even_when_they_beat_their_expectation():
    # This CPU's fresh calibration of the built-in pair: a 2-row cycle costs 2.7 plain steps, so
    # even an accepted draft (2 tokens) loses to plain decoding; acceptance 0.8 means most probes
    # beat the estimate's mean. They must still back off, not return at the base wait (that
    # rule probed 62 times here).
    costs = CostTable(1.0, {2: 2.0, 16: 12.0}, {2: 0.7, 16: 3.0})
    policy = BlockPolicy(costs, 16, AcceptanceEstimate(15, seed=[0.8] * 15))
    seconds, blocks = simulate(policy, costs, [0.8] * 15, 4000, seed=5)
    assert 1 <= policy.report.probes <= 8  # the wait doubles after each
    assert 4000 / seconds >= 0.99 / costs.plain


def test_never_probes_when_full_acceptance_cannot_win():
    costs = CostTable(1.0, {2: 2.5, 16: 20.0}, {2: 0.5, 16: 1.0})
    policy = BlockPolicy(costs, 16)
    seconds, blocks = simulate(policy, costs, [1.0] * 15, 500)
    assert set(blocks) == {1} and policy.report.probes == 0
    assert "fully accepted" in policy.report.fallbacks[0][1]


def test_probe_notices_when_drafting_pays_again():
    costs = CostTable(1.0, {2: 1.1, 8: 1.3}, {2: 0.3, 8: 0.3})
    policy = BlockPolicy(costs, 8, AcceptanceEstimate(7, seed=[0.05]))
    seconds, blocks = simulate(policy, costs, [0.02] * 7, 3000, seed=3, switch=(400, [0.9] * 7))
    assert blocks[0] == 1
    assert policy.report.probes >= 1
    tail = blocks[-50:]
    assert all(B > 1 for B in tail)


def test_short_remainders_decode_plainly():
    costs = CostTable(1.0, {2: 1.0, 8: 1.0}, {2: 0.1, 8: 0.1})
    policy = BlockPolicy(costs, 8, AcceptanceEstimate(7, seed=[0.9]))
    assert decide(policy, 1) == 1
    assert decide(policy, 3) == 4  # never drafts past the tokens still wanted


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run_timed(policy, clock, actual, alphas, tokens, seed=0):
    """Like `simulate`, but time passes by the `actual` costs, which the
    policy only sees through its clock."""
    rng, done, blocks = random.Random(seed), 0, []
    while done < tokens:
        B = decide(policy, tokens - done)
        blocks.append(B)
        if B == 1:
            clock.now += actual.plain
            done += 1
            continue
        a = accepted_run(rng, alphas, B - 1)
        policy.observe(B - 1, a)
        clock.now += actual.cycle(B)
        done += a + 1
    return clock.now, blocks


def test_probes_are_spaced_by_what_they_cost_on_the_clock():
    # A probe's draft takes the plain run's pending rows into the drafter's cache, which no
    # calibrated cycle pays: here it costs 8 plain steps, not the calibrated 2.7. The loop's
    # order (the cycle runs, then `observe`) lets the policy see that and wait longer.
    costs = CostTable(1.0, {2: 2.0, 16: 12.0}, {2: 0.7, 16: 3.0})

    def probes(probe_cost):
        """Where the probes came (tokens decoded before each), and the rate against plain."""
        clock, rng, done, at = Clock(), random.Random(4), 0, []
        policy = BlockPolicy(costs, 16, AcceptanceEstimate(15, seed=[0.5] * 15), clock=clock)
        while done < 3000:
            B = decide(policy, 3000 - done)
            if B == 1:
                clock.now += 1.0
                done += 1
                continue
            at.append(done)
            a = accepted_run(rng, [0.5] * 15, B - 1)
            clock.now += probe_cost
            policy.observe(B - 1, a)
            done += a + 1
        return at, 3000 / clock.now

    cheap, _ = probes(costs.cycle(2))
    dear, rate = probes(8.0)
    # The second probe waits for what the first cost (about 6 plain steps lost, not 1.2): one
    # probe in the first 600 tokens instead of three (the spec cost scale alone gave two).
    assert len([t for t in cheap if t < 600]) == 3 and len([t for t in dear if t < 600]) == 1
    assert rate >= 0.99


def test_costs_learned_online_override_a_wrong_calibration():
    # Calibrated while plain decoding looked slow: drafting looks about 1.25x better.
    calibrated = CostTable(1.0, {2: 1.5, 4: 2.0}, {2: 0.0, 4: 0.0})
    alphas = [0.7] * 3
    # In this run a cycle costs twice the calibration: plain decoding is the faster one.
    actual = CostTable(1.0, {2: 3.0, 4: 4.0}, {2: 0.0, 4: 0.0})
    clock = Clock()
    policy = BlockPolicy(calibrated, 4, AcceptanceEstimate(3, seed=[0.7]), clock=clock)
    seconds, blocks = run_timed(policy, clock, actual, alphas, 1000)
    assert blocks[0] > 1 and policy.report.fallbacks  # started drafting, then fell back
    assert policy.scale["spec"] == pytest.approx(2.0, rel=0.15)
    assert 1000 / seconds >= 0.95 / actual.plain
    # Without the clock it keeps drafting at the calibrated (wrong) costs.
    blind = BlockPolicy(calibrated, 4, AcceptanceEstimate(3, seed=[0.7]))
    blind_seconds, blind_blocks = run_timed(blind, Clock(), actual, alphas, 1000)
    assert blind_blocks.count(1) < 100 and blind_seconds > 1.3 * seconds
