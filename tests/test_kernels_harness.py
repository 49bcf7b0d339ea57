"""The Metal kernel bodies, compiled with g++ and run on the CPU, against their twins.

The kernels are built by the library's own wrappers (`metal_kernels.conv_kernel`,
`path_select_kernel`) with the harness standing in for `mx.fast.metal_kernel`,
so the grid, template arguments and input order are tested along with the
bodies. Tolerances are stated in kernel_harness/checks.py.
"""

import importlib.util
import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx.engine.drafter import conv as conv_op
from dflash2_mlx.engine.drafter import selector as selector_op
from dflash2_mlx.kernels import metal_cuda as metal_kernels
from dflash2_mlx.kernels import registry as kernels
from dflash2_mlx.metal import read_body
from dflash2_mlx.engine.drafter.selector import path_select_ops

# ~20 s here, nearly all of it g++ (about 1 s per distinct kernel source).
pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is needed to compile the kernel bodies"),
    pytest.mark.slow,
]

from kernel_harness.checks import (  # noqa: E402
    CDF_EDGE_ROWS,
    U_TOP,
    assert_conv_matches,
    assert_path_matches,
    cdf_edge_inputs,
    conv_inputs,
    fp32_cdf_end,
    greedy_gap,
    lattice64,
    path_inputs,
    path_rows,
    sampled_uniforms,
)
from kernel_harness.harness import MetalHarness  # noqa: E402

HARNESS_THREADS = 32  # one simulated threadgroup = this many OS threads


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return MetalHarness(tmp_path_factory.mktemp("metal_harness"))


@pytest.fixture(scope="module")
def conv(harness):
    return metal_kernels.conv_kernel(harness.metal_kernel)


@pytest.fixture(scope="module")
def path_select(harness):
    return metal_kernels.path_select_kernel(harness.metal_kernel, threads=HARNESS_THREADS)


def mutated(harness, old: str, new: str):
    """A factory like the harness's, compiling the body with `old` replaced by `new`."""

    def factory(**kwargs):
        assert old in kwargs["source"], f"mutation target {old!r} not in the body"
        kwargs["source"] = kwargs["source"].replace(old, new)
        return harness.metal_kernel(**kwargs)

    return factory


# --------------------------------------------------------------------------- conv

CONV_SHAPES = [  # N, B, H, group_size
    (1, 2, 32, 8),
    (3, 16, 64, 8),
    (2, 16, 256, 32),
    (2, 5, 96, 32),  # H not a multiple of the 256-thread group: a partial group
]


@pytest.mark.parametrize("N,B,H,group_size", CONV_SHAPES)
def test_conv_matches_twin_f32(conv, N, B, H, group_size):
    assert_conv_matches(conv, *conv_inputs(N * 100 + H, N, B, H, group_size))


@pytest.mark.parametrize("dtype,base_dtype,shape", [
    (mx.bfloat16, mx.bfloat16, (2, 16, 64, 8)),
    (mx.bfloat16, mx.float32, (1, 2, 256, 32)),  # base cast to x's dtype, as the twin does
    (mx.float16, mx.float16, (3, 16, 32, 8)),
])
def test_conv_matches_twin_16bit(conv, dtype, base_dtype, shape):
    N, B, H, group_size = shape
    assert_conv_matches(conv, *conv_inputs(7, N, B, H, group_size, dtype, base_dtype))


def test_conv_identity_at_init(conv):
    # An untrained conv (base = [1, 0], no correction) returns x bit for bit.
    x = mx.array(np.random.default_rng(3).standard_normal((2, 16, 64), dtype=np.float32))
    base = mx.concatenate([mx.ones((1, 64)), mx.zeros((1, 64))])
    y = conv(x, mx.zeros((2, 16, 2, 8)), base, 8)
    np.testing.assert_array_equal(np.array(y), np.array(x))


def test_conv_rejects_mismatched_shapes(conv):
    x, delta, base, _ = conv_inputs(0, 1, 2, 32, 8)
    with pytest.raises(ValueError):
        conv(x, delta, base, 5)  # does not divide H
    with pytest.raises(ValueError):
        conv(x, delta, base, 16)  # delta has 4 groups, not 2


# --------------------------------------------------------------------------- path, greedy

PATH_SHAPES = [  # N, K, R, V
    (1, 16, 8, 50),
    (15, 16, 64, 1000),
    (16, 16, 256, 1000),
    (2, 16, 32, 50),
    (6, 4, 16, 50),
]


@pytest.mark.parametrize("N,K,R,V", PATH_SHAPES)
def test_path_greedy_matches_twin(path_select, N, K, R, V):
    args = path_inputs(N * 1000 + V, N, K, R, V)
    # Scores are summed in a different order than the twin's matmul; a near-tie
    # would make the exact comparison a coin flip, so the draw must not have one.
    assert greedy_gap(args) > 1e-3, "draw has a near-tie on the greedy path; pick another seed"
    assert_path_matches(path_select, args)


def test_path_greedy_bf16_codebooks(path_select):
    args = path_inputs(5, 15, 16, 64, 1000, dtype=mx.bfloat16)
    assert greedy_gap(args) > 1e-3
    assert_path_matches(path_select, args)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_path_greedy_ties_go_to_smallest_index(path_select, seed):
    # Small integers: every score is exact, so ties are real ties on every backend.
    args = path_inputs(seed, 16, 16, 4, 50, integer=True)
    picks, _ = path_select_ops(*args)
    rows = path_rows(args, picks)
    tied = (rows == rows.max(axis=-1, keepdims=True)).sum(axis=-1) > 1
    assert tied.any(), "the draw has no tie on the path, so it tests nothing"
    assert_path_matches(path_select, args)


def test_path_greedy_all_equal_scores(path_select):
    # Gate 0 and equal unaries: every lattice entry ties, so every pick is 0.
    N, K = 16, 16
    args = list(path_inputs(4, N, K, 8, 50))
    args[0] = mx.full((N, K), 0.5)
    args[3] = mx.zeros((N, 8))
    picks, q = path_select(*args)
    np.testing.assert_array_equal(np.array(picks), np.zeros(N, np.int32))
    assert_path_matches(path_select, args)


def test_path_per_row_codebooks(path_select):
    # Quantized codebooks reach the kernel as one row per (position, candidate).
    N, K, R = 15, 16, 32
    unary, pred_ids, cand_ids, gate, A, B = path_inputs(9, N, K, R, 1000)
    local = mx.arange(N * K, dtype=mx.int32).reshape(N, K)
    args = (unary, local, local, gate, A[pred_ids].reshape(N * K, R), B[cand_ids].reshape(N * K, R))
    assert greedy_gap(args) > 1e-3
    assert_path_matches(path_select, args)


@pytest.mark.parametrize("threads", [1, 7, 64])
def test_path_any_threadgroup_size(harness, threads):
    # The scoring loop is strided over the group, so its size must not matter.
    fn = metal_kernels.path_select_kernel(harness.metal_kernel, threads=threads)
    args = path_inputs(21, 15, 16, 32, 1000)
    assert greedy_gap(args) > 1e-3
    assert_path_matches(fn, args)
    assert_path_matches(fn, args, 1.0, sampled_uniforms(args, 1.0, 21))


# --------------------------------------------------------------------------- path, sampled


@pytest.mark.parametrize("N,K,R,V", PATH_SHAPES)
@pytest.mark.parametrize("temperature", [0.7, 2.5])
def test_path_sampled_matches_twin(path_select, N, K, R, V, temperature):
    args = path_inputs(N * 1000 + V + 1, N, K, R, V)
    u = sampled_uniforms(args, temperature, seed=N + K)
    assert_path_matches(path_select, args, temperature, u)


def test_path_sampled_equal_logits_hits_exact_cdf_steps(path_select):
    # All scores equal: q = 1/16 exactly and the CDF steps are exact multiples of
    # 1/16, so uniforms sitting exactly on a step test `cdf <= u` (not `<`).
    N, K = 6, 16
    args = list(path_inputs(4, N, K, 8, 50))
    args[0] = mx.zeros((N, K))
    args[3] = mx.zeros((N, 8))
    u = mx.array([0.0, 0.0625, 0.5, 0.53, 0.9999, 1.0])
    picks, q = path_select_ops(*args, temperature=1.0, uniforms=u)
    assert np.array(q).tolist() == [[1 / 16] * K] * N  # the premise: exact steps
    np.testing.assert_array_equal(np.array(picks), [0, 1, 8, 8, 15, 15])
    assert_path_matches(path_select, args, 1.0, u)


@pytest.mark.parametrize("finite", CDF_EDGE_ROWS, ids=["3a", "3b", "5"])
def test_path_sampled_cdf_edge_picks_a_candidate_with_mass(path_select, finite):
    # The kernel's own fp32 CDF ends below u: it must not run off onto a q = 0 candidate.
    args, u = cdf_edge_inputs(finite)
    picks, q = path_select(*args, temperature=1.0, uniforms=u)
    assert fp32_cdf_end(q) < U_TOP, "premise: the kernel's CDF ends below u"
    assert picks.tolist() == [len(finite) - 1] and np.array(q)[0, picks.item()] > 0
    assert_path_matches(path_select, args, 1.0, u)


def test_path_sampled_needs_uniforms(path_select):
    with pytest.raises(ValueError):
        path_select(*path_inputs(0, 2, 16, 8, 50), temperature=1.0)


def test_path_rejects_mismatched_shapes(path_select):
    unary, pred_ids, cand_ids, gate, A, B = path_inputs(0, 3, 16, 8, 50)
    with pytest.raises(ValueError):
        path_select(unary, pred_ids, cand_ids, gate[None], A, B)  # gate with a batch axis
    with pytest.raises(ValueError):
        path_select(unary, pred_ids, cand_ids, gate, A[:, :4], B)  # rank mismatch


# --------------------------------------------------------------------------- self-check


def test_self_check_problem_is_decisive():
    # The builder's self-check compares picks exactly, so its problem must have
    # integer scores (exact anywhere) and uniforms well away from CDF steps.
    args, u = metal_kernels.path_check_problem()
    assert np.array_equal(lattice64(args), np.round(lattice64(args)))
    _, q = path_select_ops(*args, temperature=1.0, uniforms=u)
    cdf = np.cumsum(np.array(q, np.float64), axis=-1)
    assert np.min(np.abs(cdf - np.array(u)[:, None])) > 1e-3


def test_build_kernel_passes_self_check(harness, recwarn):
    assert callable(metal_kernels.build_kernel("two_tap_conv", harness.metal_kernel, conv_op.agrees_with_twin))
    assert callable(metal_kernels.build_kernel("path_select", harness.metal_kernel, selector_op.agrees_with_twin))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# --------------------------------------------------------------------------- mutations
# Each mutation is a plausible bug. The same assertion helpers the tests above use
# must reject it; if one ever passes, the harness has lost its teeth.

CONV_MUTATIONS = {
    "shift off by one (row 1 also reads zero)": ("t > 0 ?", "t > 1 ?"),
    "shift crosses blocks": ("t > 0 ?", "row > 0 ?"),
    "tap 1 uses tap 0's correction": ("delta[d + G + g]", "delta[d + g]"),
}


@pytest.mark.parametrize("name", CONV_MUTATIONS)
def test_conv_mutation_is_caught(harness, name):
    broken = metal_kernels.conv_kernel(mutated(harness, *CONV_MUTATIONS[name]))
    with pytest.raises(AssertionError, match="conv: .* outside tolerance"):
        assert_conv_matches(broken, *conv_inputs(3 * 100 + 64, 3, 16, 64, 8))


def test_greedy_tie_break_mutation_is_caught(harness):
    # `>=` keeps the last maximum: ties go to the largest index.
    broken = metal_kernels.path_select_kernel(
        mutated(harness, "lattice[row + c] > best_score", "lattice[row + c] >= best_score"),
        threads=HARNESS_THREADS)
    args = path_inputs(0, 16, 16, 4, 50, integer=True)  # the tie test's draw
    with pytest.raises(AssertionError, match="picks differ"):
        assert_path_matches(broken, args)


PATH_MUTATIONS = {
    "walk ignores the predecessor": ("(size_t(t) * K + prev) * K", "(size_t(t) * K + 0) * K", 0.0),
    "gate dropped": ("* float(gate[g_row + j])", "", 0.0),
    "inverse CDF uses <": ("cdf <= u", "cdf < u", 1.0),
    "CDF edge clamps to K - 1": ("count < last ? count : last", "count < K - 1 ? count : K - 1", 1.0),
}


@pytest.mark.parametrize("name", PATH_MUTATIONS)
def test_path_mutation_is_caught(harness, name):
    old, new, temperature = PATH_MUTATIONS[name]
    broken = metal_kernels.path_select_kernel(mutated(harness, old, new), threads=HARNESS_THREADS)
    if temperature == 0:
        args, u = path_inputs(15 * 1000 + 1000, 15, 16, 64, 1000), None
    elif name.startswith("CDF edge"):
        args, u = cdf_edge_inputs(CDF_EDGE_ROWS[0])
    else:  # the exact-step case: only there do `<` and `<=` differ reliably
        args = list(path_inputs(4, 6, 16, 8, 50))
        args[0], args[3] = mx.zeros((6, 16)), mx.zeros((6, 8))
        u = mx.array([0.0, 0.0625, 0.5, 0.53, 0.9999, 1.0])
    with pytest.raises(AssertionError):
        assert_path_matches(broken, args, temperature, u)


def test_self_check_rejects_a_broken_kernel(harness):
    # The builder's own check must catch a wrong kernel and fall back, warning once.
    factory = mutated(harness, "t > 0 ?", "t > 1 ?")
    with pytest.warns(RuntimeWarning, match="two_tap_conv") as caught:
        assert metal_kernels.build_kernel("two_tap_conv", factory, conv_op.agrees_with_twin) is None
    assert len(caught) == 1


def test_bodies_are_the_shipped_files(harness, conv):
    # What the harness compiled is the package data, not a copy.
    conv(*conv_inputs(0, 1, 2, 32, 8))
    assert read_body("two_tap_conv") in harness.sources["dflash2_two_tap_conv"]


def test_benchmark_times_active_kernels(harness, monkeypatch, tmp_path):
    # The Metal branch of benchmarks/decode/kernels.py, with harness kernels standing in.
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "decode" / "kernels.py"
    spec = importlib.util.spec_from_file_location("benchmark_kernels", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fused = {"two_tap_conv": metal_kernels.conv_kernel(harness.metal_kernel),
             "path_select": metal_kernels.path_select_kernel(harness.metal_kernel, threads=HARNESS_THREADS)}
    monkeypatch.setattr(kernels, "active", fused.get)
    out = tmp_path / "kernels.json"
    bench.main(["--hidden", "64", "--vocab", "300", "--rank", "16", "--dtype", "float32",
                "--repeats", "2", "--warmup", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["kernel_status"] == {"two_tap_conv": "kernel", "path_select": "kernel"}
    assert set(report["results"]) == {"two_tap_conv", "path_select_greedy", "path_select_sampled"}
    for row in report["results"].values():
        assert row["kernel_ms"] > 0 and row["twin_ms"] > 0
        assert row["agrees_with_twin"] is True
