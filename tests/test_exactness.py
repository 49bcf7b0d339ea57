"""Where exactness holds (engine/adaptive/exactness.py): the start-up probe says
"bitwise" on the CPU backend (built-in pair, tiny pairs), the verdict function
calls one ulp "equal up to the backend's kernel rounding", the verdict is cached
and reused, compare's parity names the first divergence, and generate, compare
and doctor carry the verdict."""

import json
import os

import numpy as np
import pytest

from dflash2_mlx.engine.adaptive.exactness import (BITWISE, ROUNDING, compare_logits, exactness_path,
                                                   load_or_probe, probe)
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.tools.compare import first_divergence, parity
from helpers import drafter_folder, load_pair_for, target_folder
from test_compare import fake_run

PROMPT_IDS = [5, 17, 42, 9, 100, 3, 77, 8]


@pytest.fixture(scope="module")
def tiny_pair():
    target, _, drafter = load_pair_for("qwen3", "dflash2")
    return Pair.make(target, drafter)


# -- the probe on this backend ----------------------------------------------------------------


def test_the_probe_is_bitwise_on_the_builtin_pair():
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.prompt import build_prompt
    from dflash2_mlx.tools.suites import SUITES

    pair, tokenizer = load_pair("builtin", "builtin", None)
    found = probe(pair, build_prompt(tokenizer, SUITES["code"][0]))
    assert (found.verdict, found.max_abs_diff, found.rows) == (BITWISE, 0.0, pair.max_block_size)
    assert found.argmax_agreed == found.rows
    assert "greedy output equals plain decoding token for token" in found.line()


@pytest.mark.parametrize("bits", [None, 4])
def test_the_probe_is_bitwise_on_a_tiny_pair(bits):
    target, _, drafter = load_pair_for("qwen3", "dflash2", quantize_bits=bits)
    found = probe(Pair.make(target, drafter), PROMPT_IDS)
    assert found.bitwise and found.verdict == BITWISE and found.max_abs_diff == 0.0
    assert found.rows == drafter.config.block_size == found.argmax_agreed


def test_the_probe_checks_that_the_same_verify_repeats(tiny_pair, monkeypatch):
    """Run to run: the same verify twice (over the probe's cache; `repeatable`, which CUDA also
    runs, after a context past 256 keys) gives the same logits on the CPU backend; a backend
    that does not (cuDNN's decode attention past 256 keys) is reported in the line users see
    and in the record."""
    from dflash2_mlx.engine.adaptive import exactness

    assert exactness.repeatable(tiny_pair, PROMPT_IDS, 8)
    found = probe(tiny_pair, PROMPT_IDS)
    assert found.deterministic and "not deterministic" not in found.line()
    real = tiny_pair.target.forward_undoable
    calls = []

    def drifting(tokens, cache, layer_ids):  # a backend whose second pass differs in the last bits
        logits, features, undo = real(tokens, cache, layer_ids)
        calls.append(1)
        return logits * (1 + 1e-6 * (len(calls) % 2)), features, undo

    monkeypatch.setattr(tiny_pair.target, "forward_undoable", drifting)
    assert not exactness.repeatable(tiny_pair, PROMPT_IDS, 8)
    calls.clear()
    assert not probe(tiny_pair, PROMPT_IDS).deterministic  # its own check, over the probe's cache
    odd = found.__class__(True, 0.0, 8, 8, deterministic=False)
    for greedy in (True, False):
        assert "not deterministic: the same verify twice gave other logits" in odd.line(greedy)
    assert odd.report()["deterministic"] is False


# -- the verdict function -----------------------------------------------------------------------


def test_one_ulp_is_kernel_rounding_not_bitwise():
    logits = np.random.RandomState(0).randn(4, 50).astype(np.float32)
    assert compare_logits(logits, logits.copy()).verdict == BITWISE
    nudged = logits.copy()
    nudged[2, 7] = np.nextafter(nudged[2, 7], np.float32(np.inf))
    found = compare_logits(logits, nudged)
    assert (found.bitwise, found.verdict, found.rows, found.argmax_agreed) == (False, ROUNDING, 4, 4)
    assert found.max_abs_diff == float(nudged[2, 7]) - float(logits[2, 7]) == abs(float(np.spacing(logits[2, 7]))) > 0
    line = found.line()
    assert line.startswith("equal up to the backend's kernel rounding: ") and "argmax agreed on all 4 rows" in line
    assert "\n" not in line and "can drift from plain decoding" in line
    assert "equal in distribution, not token for token" in found.line(greedy=False)
    # -0.0 == 0.0 as numbers, not as bits.
    signed = logits.copy()
    signed[0, 0], zero = np.float32(-0.0), logits.copy()
    zero[0, 0] = np.float32(0.0)
    assert compare_logits(signed, zero).verdict == ROUNDING


def test_a_flipped_tie_is_counted():
    logits = np.zeros((3, 6), np.float32)
    logits[:, 2] = 1.0
    flipped = logits.copy()
    flipped[1, 4] = np.nextafter(np.float32(1.0), np.float32(2.0))  # row 1's argmax moves to 4 by one ulp
    found = compare_logits(logits, flipped)
    assert (found.verdict, found.argmax_agreed) == (ROUNDING, 2)
    assert "argmax differed on 1 of 3 rows" in found.line()


def test_logits_of_another_shape_or_dtype_are_refused():
    a = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError):
        compare_logits(a, np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError):
        compare_logits(a, a.astype(np.float64))


# -- the cache ----------------------------------------------------------------------------------


def test_the_cached_verdict_is_reused(tiny_pair, tmp_path):
    first = load_or_probe(tiny_pair, tmp_path, PROMPT_IDS)
    path = exactness_path(tiny_pair, tmp_path)
    assert first.path == path and path.exists() and not first.cached and first.bitwise
    assert path.parent == tmp_path and path.name.startswith("exactness-")
    # Plant a verdict a probe here would never give: a reuse returns it, a re-run would not.
    record = json.loads(path.read_text())
    assert record["key"]["backend"] == "cpu" and record["key"]["mlx"] and record["key"]["target"]
    record.update(verdict=ROUNDING, max_abs_diff=0.25)
    path.write_text(json.dumps(record))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    again = load_or_probe(tiny_pair, tmp_path, PROMPT_IDS)
    assert (again.cached, again.verdict, again.max_abs_diff) == (True, ROUNDING, 0.25)
    assert path.stat().st_mtime_ns == 1_000_000_000 and json.loads(path.read_text()) == record
    # Asked to, it probes again and replaces the file; a file for another key is not read.
    fresh = load_or_probe(tiny_pair, tmp_path, PROMPT_IDS, again=True)
    assert (fresh.cached, fresh.verdict) == (False, BITWISE) and path.stat().st_mtime_ns != 1_000_000_000
    record["key"] = {**record["key"], "mlx": "0.0.0"}
    path.write_text(json.dumps(record))
    assert load_or_probe(tiny_pair, tmp_path, PROMPT_IDS).verdict == BITWISE


# -- compare's parity names the first divergence ---------------------------------------------


@pytest.mark.parametrize("k", [0, 3, 7])
def test_parity_names_the_first_divergence(k):
    plain = list(range(10, 18))
    spec = list(plain)
    spec[k] = 99
    if k + 2 < len(spec):
        spec[k + 2] = 98  # a later difference too: the first one is named
    assert first_divergence(plain, spec) == k
    assert first_divergence(plain, plain) is None and first_divergence(plain, plain[:k]) == k
    p = parity(fake_run("ar", plain, [0.1] * 8), fake_run("dflash2", spec, [0.1] * 8), greedy=True)
    assert (p.index, p.ar_token, p.spec_token) == (k, plain[k], 99)
    assert p.message.startswith(f"diverged at token {k}: ")


# -- the commands -----------------------------------------------------------------------------------


def pair_argv():
    return ["--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2")]


def test_generate_says_where_exactness_holds(cli):
    code, out, err = cli(["generate", *pair_argv(), "-p", "Write a loop", "-m", 6, "--json"])
    assert code == 0, err
    exact = json.loads(out)["stats"]["exactness"]
    assert exact["verdict"] == BITWISE and exact["max_abs_diff"] == 0.0 and "token for token" in exact["message"]
    code, out, err = cli(["generate", *pair_argv(), "-p", "Write a loop", "-m", 6, "--temp", "0.8", "--json"])
    assert code == 0, err
    assert "equal in distribution, not token for token" in json.loads(out)["stats"]["exactness"]["message"]
    code, out, err = cli(["generate", *pair_argv(), "-p", "Write a loop", "-m", 6])
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("[exactness: ")] == [
        f"[exactness: {exact['message']}]"]
    code, out, err = cli(["generate", *pair_argv(), "-p", "Write a loop", "-m", 6, "--ar", "--json"])
    assert code == 0 and "exactness" not in json.loads(out)["stats"]  # plain decoding is the reference


def test_compare_says_where_exactness_holds(cli):
    argv = ["compare", *pair_argv(), "-p", "Write a loop", "-m", 8, "--block-size", 4, "--repeats", 1, "--no-live"]
    code, out, err = cli([*argv, "--json"])
    assert code == 0, err
    record = json.loads(out)
    assert record["parity"]["verdict"] == "identical" and record["exactness"]["verdict"] == BITWISE
    code, out, err = cli(argv)
    assert code == 0, err
    assert "exactness: bitwise: a 16-row verify" in " ".join(out.split())


def test_doctor_shows_the_verdict(cli):
    # Near-zero acceptance on the tiny random pair ends the run at the self-test, which carries the verdict.
    code, out, err = cli(["doctor", "--json", *pair_argv()])
    assert code == 1, err
    test = next(s for s in json.loads(out)["sections"] if s["title"] == "Acceptance self-test")
    assert test["data"]["exactness"]["verdict"] == BITWISE and test["data"]["exactness"]["rows"] == 16
    found = {f["name"]: f for f in test["findings"]}
    assert found["exactness"]["status"] == "ok" and found["exactness"]["message"].startswith("bitwise: ")
    code, out, err = cli(["doctor", *pair_argv()])
    assert code == 1 and "exactness" in out and "bitwise: a 16-row verify" in " ".join(out.split())
