"""The sampled walk never picks a candidate whose proposal probability is 0.

In fp32 the CDF of a softmax row can end below 1 (here at 1 - 2^-23) while a
uniform in [0, 1) lies above it (1 - 2^-24). A clamp to the last candidate then
picks one whose q underflowed to 0, and exact verification accepts it with
probability min(1, p / 0) = 1. The Metal kernel gets the same check in
test_kernels_harness.py.
"""

import numpy as np
import pytest

from dflash2_mlx.engine.drafter.selector import path_select_ops
from kernel_harness.checks import CDF_EDGE_ROWS, U_TOP, cdf_edge_inputs, fp32_cdf_end


@pytest.mark.parametrize("finite", CDF_EDGE_ROWS, ids=["3a", "3b", "5"])
def test_uniform_above_a_short_cdf_picks_a_candidate_with_mass(finite):
    args, u = cdf_edge_inputs(finite)
    picks, q = path_select_ops(*args, temperature=1.0, uniforms=u)
    q = np.array(q)
    # The premise: every -300 candidate has q == 0 and the CDF ends below u.
    assert (q[0, len(finite):] == 0).all() and fp32_cdf_end(q) < U_TOP
    # By hand: u lies beyond every CDF step, so the pick is the last candidate with mass.
    assert picks.tolist() == [len(finite) - 1]
    assert q[0, picks.item()] > 0
