"""Exact rejection sampling for DFlash v1, plain decoding, and a fully accepted
block's bonus: tests/test_sampling.py's chi-square test (its reference, cells
and ALPHA), in a file of its own so that the two halves of the sampling tests
run on different workers (`--dist loadfile` gives a whole file to one worker).
"""

import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams
from helpers import decode_steps
from test_sampling import (ALPHA, BONUS_SETTINGS, PROMPT, SETTINGS, _spec, exact_distribution, gof_pvalue, sample_counts,
                           tiny_drafter, tiny_target)


@pytest.fixture(scope="module")
def pair():
    target, cfg = tiny_target()
    return target, {k: tiny_drafter(cfg, k) for k in ("dflash", "dflash2")}


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
        return decode_steps(PROMPT, Pair.make(target), DecodeRequest(max_tokens=3, sampling=s))
    p = gof_pvalue(sample_counts(ar), table)
    print(f"autoregressive: chi-square p = {p:.3g}")
    assert p > ALPHA, f"autoregressive: chi-square p = {p:.2e}"


# The settings and why: test_sampling.BONUS_SETTINGS.
N_BONUS = 800


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(BONUS_SETTINGS), ids=["dflash2-t0.7-top_p0.95-min_p0.1", "dflash-t2-top_k4"])
def test_full_block_bonus_matches_target_distribution(pair, kind):
    target, drafters = pair
    settings = BONUS_SETTINGS[kind]
    table = exact_distribution(target, settings)
    full = []
    counts = sample_counts(_spec(target, drafters[kind], settings, B=2), n=N_BONUS, bonus_after_full=full)
    # The bonus of a fully accepted block is committed often enough to be tested.
    assert full[0] > 0.05 * N_BONUS, f"only {full[0]} of {N_BONUS} samples committed a full block's bonus"
    p = gof_pvalue(counts, table, n=N_BONUS)
    print(f"{kind} block 2 {settings}: {full[0]} full-block bonuses, chi-square p = {p:.3g}")
    assert p > ALPHA, f"chi-square p = {p:.2e}"
