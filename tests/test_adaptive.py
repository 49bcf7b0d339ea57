"""The block-size policy against injected cost tables and scripted acceptance.

Acceptance is simulated: a cycle at block size B accepts the leading run of
B - 1 Bernoulli draws with the given per-position rates (seeded), which is
what a drafter with those conditional acceptance rates does.
"""

import random

import pytest

from dflash2_mlx.engine.adaptive.costs import ContextCosts
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



def test_the_first_timed_cycles_correct_a_calibration_that_is_far_off():
    # Past the calibrated contexts the costs are extended linearly, and noise in a short
    # calibration can make cycles look several times cheaper than they are (measured at 16k:
    # auto drafted a few cycles and ran at 0.85x --ar). The first timed cycle replaces the
    # calibrated cost (not halfway to it, nor by the 0.1 of a long run).
    calibrated = CostTable(1.0, {2: 1.6, 4: 2.0, 8: 2.6, 16: 4.0}, {B: 0.0 for B in (2, 4, 8, 16)})
    actual = CostTable(1.0, {2: 3.0, 4: 3.3, 8: 5.9, 16: 10.3}, {B: 0.0 for B in (2, 4, 8, 16)})
    alphas = [0.75, 0.55, 0.4, 0.2] + [0.1] * 11
    clock = Clock()
    policy = BlockPolicy(calibrated, 16, AcceptanceEstimate(15, seed=[0.58, 0.45, 0.3]), clock=clock)
    B = decide(policy, 64)
    assert B > 1  # the calibration says drafting pays
    policy.observe(B - 1, 0)
    clock.now += 3.0 * calibrated.cycle(B)
    decide(policy, 63)
    assert policy.scale["spec"] == pytest.approx(3.0)
    # A 64-token answer loses little to it.
    rates = rates_against_plain(calibrated, actual, alphas, [0.58, 0.45, 0.3])
    assert sum(rates) / len(rates) >= 0.94


def rates_against_plain(calibrated, actual, alphas, seed_alphas, tokens=64, seeds=10):
    """Per seed, a fresh policy's rate on a `tokens`-token answer relative to plain decoding."""
    rates = []
    for seed in range(seeds):
        clock = Clock()
        policy = BlockPolicy(calibrated, 16, AcceptanceEstimate(15, seed=seed_alphas), clock=clock)
        seconds, _ = run_timed(policy, clock, actual, alphas, tokens, seed=seed)
        rates.append(tokens * actual.plain / seconds)
    return rates


def test_a_calibration_taken_on_a_busy_machine_is_replaced_within_a_few_cycles():
    # Measured under load: plain steps look 2x dearer than they are and cycles 1.3x, so the table
    # says drafting pays where it loses. Within the run's first cycles the policy must see the
    # real costs and run at plain decoding's rate or better, on a 64-token answer.
    actual = CostTable(1.0, {2: 2.4, 4: 3.0, 8: 4.6, 16: 8.0}, {B: 0.0 for B in (2, 4, 8, 16)})
    busy = CostTable(2.0, {B: 1.3 * c for B, c in actual.verify.items()}, {B: 0.0 for B in (2, 4, 8, 16)})
    alphas = [0.6, 0.4, 0.25] + [0.1] * 12
    clock = Clock()
    policy = BlockPolicy(busy, 16, AcceptanceEstimate(15, seed=[0.6, 0.4, 0.25]), clock=clock)
    _, blocks = run_timed(policy, clock, actual, alphas, 12)
    assert policy.scale["spec"] == pytest.approx(1 / 1.3, rel=0.02)  # each timed cycle was 1/1.3 of the table
    assert policy.scale["plain"] == pytest.approx(0.5)  # and each plain step 1/2: replaced, not averaged
    # One cycle found the table off: plain decoding was timed at once, and drafting stopped.
    assert blocks[0] > 1 and blocks[1:] == [1] * (len(blocks) - 1), blocks
    rates = rates_against_plain(busy, actual, alphas, [0.6, 0.4, 0.25])
    # What is left is that first cycle and one later probe, on a 64-token answer.
    assert sum(rates) / len(rates) >= 0.95 and min(rates) >= 0.94, rates


def run_timed_at(policy, clock, actual, alphas, tokens, context, seed=0):
    """`run_timed` after a `context`-token prompt, telling the policy the context as the loop does."""
    rng, done, blocks = random.Random(seed), 0, []
    while done < tokens:
        decision = policy.choose(tokens - done, context + done)
        policy.record(decision)
        blocks.append(decision.block)
        if decision.block == 1:
            clock.now += actual.plain
            done += 1
            continue
        a = accepted_run(rng, alphas, decision.block - 1)
        policy.observe(decision.block - 1, a)
        clock.now += actual.cycle(decision.block)
        done += a + 1
    return clock.now, blocks


def calibrated_at_256_and_2048(plain_at_32k):
    """Costs measured at 256 and 2,048 tokens (the built-in pair's look-alike on this machine's
    CPU, rounded), the 2,048 plain step set so that its extension reaches `plain_at_32k` s."""
    cycles = {256: {2: 0.021, 4: 0.028, 8: 0.047, 16: 0.126}, 2048: {2: 0.035, 4: 0.054, 8: 0.092, 16: 0.171}}
    plain_256 = 0.0078
    plain_2048 = plain_256 + (plain_at_32k - plain_256) * (2048 - 256) / (32768 - 256)
    return ContextCosts({c: CostTable(plain, cycles[c], {B: 0.0 for B in cycles[c]}, cycles[c])
                         for c, plain in ((256, plain_256), (2048, plain_2048))})


def test_far_past_the_calibrated_contexts_plain_decoding_is_timed_before_drafting():
    # At 32k a plain step measured 0.13 s and a 4-row cycle 0.50 s: drafting loses. A busy spell
    # while the 2,048-token point was timed extends the plain step to 3x its cost at 32k, and the
    # policy drafted on that (0.87x plain decoding over 64 tokens: 0.89x was measured at 32k).
    actual = CostTable(0.13, {2: 0.27, 4: 0.50, 8: 0.89, 16: 1.73}, {B: 0.0 for B in (2, 4, 8, 16)})
    alphas = [0.8, 0.7, 0.6] + [0.3] * 12
    for factor in (0.5, 1.0, 3.0):
        calibrated = calibrated_at_256_and_2048(factor * actual.plain)
        rates = []
        for seed in range(20):
            clock = Clock()
            policy = BlockPolicy(calibrated, 16, AcceptanceEstimate(15, seed=[0.125]), clock=clock)
            seconds, blocks = run_timed_at(policy, clock, actual, alphas, 64, 32768, seed)
            assert blocks[:3] == [1, 1, 1]  # timed first (far past the calibrated 2,048)
            rates.append(64 * actual.plain / seconds)
        assert min(rates) >= 0.95, (factor, min(rates))
    # Where drafting wins there (a GPU: a 4-row cycle at 1.3 plain steps), those plain steps cost
    # little against the best fixed block.
    cheap = CostTable(0.13, {2: 0.15, 4: 0.17, 8: 0.26, 16: 0.45}, {B: 0.0 for B in (2, 4, 8, 16)})
    calibrated = ContextCosts({256: cheap.scaled(0.3), 2048: cheap.scaled(0.5)})
    best = best_fixed_rate(cheap, alphas, 16)
    rates = []
    for seed in range(20):
        clock = Clock()
        policy = BlockPolicy(calibrated, 16, AcceptanceEstimate(15, seed=alphas), clock=clock)
        seconds, blocks = run_timed_at(policy, clock, cheap, alphas, 64, 32768, seed)
        rates.append(64 / seconds / best)
    assert sum(rates) / len(rates) >= 0.9


# == costs that grow with the context =========================================================

from dflash2_mlx.engine.adaptive.acceptance import BandedAcceptance, context_band  # noqa: E402
from dflash2_mlx.engine.adaptive.costs import costs_from_dict  # noqa: E402


def test_context_costs_interpolate_and_extend_linearly():
    short = CostTable(1.0, {2: 2.0, 4: 3.0}, {2: 0.5, 4: 1.0}, {2: 2.0, 4: 3.0})
    long = CostTable(3.0, {2: 4.0, 4: 9.0}, {2: 0.5, 4: 2.0}, {2: 5.0, 4: 11.0})
    costs = ContextCosts({100: short, 1100: long})
    assert costs.at(0) == short and costs.at(100) == short and costs.at(1100) == long
    mid = costs.at(600)
    assert mid.plain == pytest.approx(2.0) and mid.cycle(2) == pytest.approx(3.5) and mid.cycle(4) == pytest.approx(7.0)
    far = costs.at(2100)  # past the longest measured context: the same growth per token
    assert far.plain == pytest.approx(5.0) and far.cycle(4) == pytest.approx(19.0) and far.verify[4] == pytest.approx(15.0)
    assert costs_from_dict(costs.to_dict()) == costs and costs.scaled(2.0).at(600).plain == pytest.approx(4.0)
    assert costs_from_dict(short.to_dict()) == short  # a one-context table reads back as one



def test_costs_measured_falling_with_the_context_stay_flat_past_it():
    # A busy spell during the short measurement: the long context measured cheaper. Extended
    # downhill that reached zero (doctor and a long generation failed on "a cost table needs
    # a positive plain step time"); past the last measured context it now stays level.
    short = CostTable(3.0, {2: 6.0, 4: 9.0}, {2: 1.0, 4: 2.0})
    long = CostTable(2.0, {2: 4.0, 4: 7.0}, {2: 0.5, 4: 1.0})
    costs = ContextCosts({256: short, 2048: long})
    far = costs.at(100_000)
    assert far.plain == pytest.approx(2.0) and far.cycle(4) == pytest.approx(8.0)
    assert costs.at(1152).plain == pytest.approx(2.5)  # between the two, still the line through them
    policy = BlockPolicy(costs, 4, AcceptanceEstimate(3, seed=[0.5]))
    assert policy.choose(10, 100_000).block >= 1

def run_growing(policy, costs, alphas, tokens, start=0, seed=0):
    """Decode `tokens` tokens after a `start`-token prompt, telling the policy the context
    at every decision as the loop does; costs are the true ones at that context."""
    rng, done, blocks = random.Random(seed), 0, []
    while done < tokens:
        context = start + done
        decision = policy.choose(tokens - done, context)
        policy.record(decision)
        blocks.append((context, decision.block))
        if decision.block == 1:
            done += 1
            continue
        a = accepted_run(rng, alphas, decision.block - 1)
        policy.observe(decision.block - 1, a)
        done += a + 1
    return blocks


def test_a_long_context_where_drafting_loses_decodes_plainly_there():
    # Short: a 4-row cycle costs 1.5 plain steps (a GPU). By 3,000 tokens the cycle has grown to
    # 4 plain steps (the drafter reads the whole context, the plain step barely grows).
    costs = ContextCosts({0: CostTable(1.0, {2: 1.2, 4: 1.5}, {2: 0.0, 4: 0.0}),
                          3000: CostTable(1.2, {2: 3.0, 4: 4.8}, {2: 0.0, 4: 0.0})})
    alphas = [0.8] * 3  # E_4 = 2.95 tokens a cycle
    policy = BlockPolicy(costs, 4, AcceptanceEstimate(3, seed=alphas))
    blocks = run_growing(policy, costs, alphas, 4000)
    # The break-even context: E_4 / cycle(4) = 1 / plain somewhere near 1,800 tokens.
    early = [B for c, B in blocks if c < 1200]
    late = [B for c, B in blocks if c > 2600]
    assert sum(B > 1 for B in early) / len(early) > 0.9  # drafts while it pays ...
    assert sum(B == 1 for B in late) / len(late) > 0.95  # ... and decodes plainly once it does not
    assert policy.report.fallbacks and 1200 <= policy.report.fallbacks[0][0] <= 2600


def test_drafting_starts_again_when_a_longer_context_makes_it_pay():
    # The other way round (plain decoding's cost grows faster than a cycle's): no clock, so only
    # the context can move the costs, and it must start drafting without waiting for a far probe.
    costs = ContextCosts({0: CostTable(1.0, {2: 2.5, 4: 3.5}, {2: 0.0, 4: 0.0}),
                          2000: CostTable(3.0, {2: 3.5, 4: 4.5}, {2: 0.0, 4: 0.0})})
    alphas = [0.7] * 3
    # Probes so rare (a budget of 0.01 %) that none would come in these 3,000 tokens.
    policy = BlockPolicy(costs, 4, AcceptanceEstimate(3, seed=alphas), probe_budget=1e-4, max_probe_interval=10**6)
    blocks = run_growing(policy, costs, alphas, 3000)
    assert blocks[0][1] == 1 and policy.report.fallbacks[0][0] == 0  # plain at the start
    first_cycle = next(c for c, B in blocks if B > 1)
    # Break-even is at 475 tokens, 531 with the policy's 3 % margin.
    assert 500 <= first_cycle <= 600, first_cycle
    late = [B for c, B in blocks if c > 1200]  # drafting 1.4x plain decoding and more
    assert sum(B > 1 for B in late) / len(late) > 0.9


def test_acceptance_is_kept_by_context_band():
    assert [context_band(n) for n in (0, 1023, 1024, 4095, 4096, 16384, 70000)] == [0, 0, 1, 1, 2, 3, 4]
    bands = BandedAcceptance(AcceptanceEstimate(3, seed=[0.9]))
    short = bands.at(10)
    long = bands.at(5000)  # a new band starts from the nearest shorter one ...
    assert long is not short and long.rates == pytest.approx(short.rates)
    for _ in range(40):
        long.observe(3, 0)  # ... then learns on its own
    assert long.rates[0] < 0.2 and short.rates[0] == pytest.approx(0.9) and bands.at(100) is short


def test_calibration_cuts_only_slow_measurements_to_its_budget():
    # A real model on one CPU core spent minutes of its first run measuring (a 16-block cycle
    # took seconds); a fast pair keeps every cycle it asked for.
    from dflash2_mlx.engine.adaptive.calibrate import MEASURE_BUDGET_S, _cycles_within

    assert _cycles_within(6, MEASURE_BUDGET_S / 100) == 6
    assert _cycles_within(6, MEASURE_BUDGET_S / 4) == 4
    assert _cycles_within(6, MEASURE_BUDGET_S * 2) == 2  # never fewer than two cycles to take a median of
    assert _cycles_within(3, MEASURE_BUDGET_S * 2, least=1) == 1
