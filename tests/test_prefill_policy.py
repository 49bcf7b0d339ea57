"""The target's activation dtype and the prefill (docs/long-context.md).

What dtype the target and the drafter get on each backend when none is asked
for, that the built-in target keeps its checkpoint's bf16 on the CPU (no fp32
copy of its weights), and that the prefill, chunked as mlx-lm chunks it (all
tokens but the last, then the last alone), decodes exactly what mlx-lm decodes
on the same folder, with and without the drafter. Then benchmarks/long_context/long_context.py
end to end on a tiny context list.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from dflash2_mlx import device
from dflash2_mlx.device import backend_name, default_prefill_step_size, target_activation_dtype
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.loading.builtin import resolve_builtin
from dflash2_mlx.loading.load_pair import load_pair
from helpers import decode_steps

ROOT = Path(__file__).resolve().parents[1]
cpu = pytest.mark.skipif(backend_name() != "cpu", reason="the CPU backend's policy")


@pytest.fixture(scope="module")
def builtin():
    return load_pair("builtin", "builtin")


def test_the_policy_per_backend(monkeypatch):
    monkeypatch.setattr(device, "backend_name", lambda: "cpu")
    assert target_activation_dtype(mx.bfloat16, quantized=False) == mx.bfloat16  # the checkpoint's, as mlx-lm
    assert target_activation_dtype(mx.float16, quantized=False) == mx.float16
    assert target_activation_dtype(mx.float32, quantized=False) == mx.float32
    assert target_activation_dtype(mx.bfloat16, quantized=True) == mx.float32  # bf16 scales: the slow path
    assert target_activation_dtype(mx.bfloat16, quantized=False, experts=True) == mx.float32  # gather_mm: fp32 only
    assert device.default_activation_dtype() == mx.float32  # the drafter
    assert default_prefill_step_size() == device.CPU_PREFILL_STEP_SIZE
    for backend in ("metal", "cuda"):
        monkeypatch.setattr(device, "backend_name", lambda b=backend: b)
        assert target_activation_dtype(mx.float16, quantized=False) == mx.bfloat16
        assert target_activation_dtype(mx.bfloat16, quantized=True) == mx.bfloat16
        assert device.default_activation_dtype() == mx.bfloat16
        assert default_prefill_step_size() == 2048  # mlx-lm's


@cpu
def test_the_builtin_target_keeps_its_bf16_weights(builtin):
    pair, _ = builtin
    assert pair.target.activation_dtype == mx.bfloat16
    assert pair.drafter.activation_dtype == mx.float32
    stored = mx.load(str(Path(resolve_builtin("builtin", "target")) / "model.safetensors"))
    params = dict(tree_flatten(pair.target.model.parameters()))
    assert sum(p.nbytes for p in params.values()) == sum(w.nbytes for w in stored.values())  # no fp32 copy
    assert all(p.dtype == mx.bfloat16 for p in params.values())


def _mlx_lm_tokens(ids, n, step):
    from mlx_lm.generate import generate_step as mlx_generate_step
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(resolve_builtin("builtin", "target")))
    steps = mlx_generate_step(mx.array(ids), model, max_tokens=n, sampler=make_sampler(0.0), prefill_step_size=step)
    return [int(t) for t, _ in steps]


@cpu
@pytest.mark.parametrize("step", [32, None])
def test_greedy_output_equals_mlx_lm_with_and_without_the_drafter(builtin, step):
    pair, tokenizer = builtin
    ids = tokenizer.encode("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 3)
    assert len(ids) > 32 * 2  # several chunks, and a last token alone
    N = 12
    reference = _mlx_lm_tokens(ids, N, step or 2048)
    plain = decode_steps(ids, pair.without_drafter(), DecodeRequest(max_tokens=N, prefill_step_size=step))
    drafted = decode_steps(ids, pair, DecodeRequest(max_tokens=N, block_size=8, prefill_step_size=step))
    plain, drafted = ([t for s in steps for t in s.tokens] for steps in (plain, drafted))
    assert plain == reference
    assert drafted[:N] == reference


@cpu
def test_the_prefill_runs_in_the_backends_steps(builtin, monkeypatch):
    monkeypatch.setattr(device, "CPU_PREFILL_STEP_SIZE", 16)  # read at each call: a short prompt shows the chunks
    pair, _ = builtin
    calls = []
    list(decode_steps(list(range(1, 38)), pair.without_drafter(), DecodeRequest(max_tokens=1),
                      prompt_progress_callback=lambda done, total: calls.append(done)))
    assert calls == [0, 16, 32, 37]


@pytest.mark.slow
def test_long_context_benchmark_runs_end_to_end(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "long_context"))
    import long_context

    out = tmp_path / "long.json"
    long_context.main(["--contexts", "300", "--max-tokens", "4", "--blocks", "4", "--draft-window", "16",
                       "--cache-tiers", "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["backend"] == backend_name() and record["contexts"].keys() == {"300"}
    prefill, decode = record["contexts"]["300"]["prefill"], record["contexts"]["300"]["decode"]
    assert set(prefill) == {"mlx_lm", "ar", "drafter"}
    assert all(a["prompt_tps"] > 0 and a["peak_memory_bytes"] > 0 for a in prefill.values())
    assert all(a["tokens_equal_mlx_lm"] for a in prefill.values())
    assert set(decode) == {"ar", "block_4", "auto", "window"}
    assert all(a["identical_to_ar"] and a["decode_tps_median"] > 0 for a in decode.values())
    assert decode["window"]["drafter_kv_bytes"] < decode["block_4"]["drafter_kv_bytes"]
    # What auto decided from and what it did: the calibrated tables, its cycles by block size.
    assert "256" in record["calibration"]["by_context"] and record["calibration"]["acceptance"]
    auto = decode["auto"]["runs"][0]
    assert sum(auto["block_sizes"].values()) == auto["target_passes"]
    # Time to first token through the prompt cache: the whole block of 256 comes back from
    # memory, then from disk after a "restart", with the same tokens.
    ttft = record["contexts"]["300"]["ttft"]
    assert ttft["cold"]["reused_tokens"] == 0 and ttft["disk"]["disk_tokens"] == 256
    assert ttft["memory"]["reused_tokens"] >= 256 and ttft["memory"]["disk_tokens"] == 0
    assert all(ttft[t]["same_tokens"] and ttft[t]["ttft_s"] > 0 for t in ("memory", "disk"))


@pytest.mark.slow
def test_long_context_decode_repeats_with_the_window_arm(tmp_path):
    """Repeats rewind every arm's cache for the next run; the window arm's drafter cache
    cannot be rewound that far, so it runs once (a second run failed on a stale cache)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "long_context"))
    import long_context

    out = tmp_path / "long.json"
    text = ROOT / "dflash2_mlx" / "engine"  # another text than the default (a commit's dflash2_mlx/)
    long_context.main(["--contexts", "300", "--max-tokens", "4", "--draft-window", "16", "--decode-only",
                       "--arms", "ar", "window", "--repeats", "2", "--context-from", str(text), "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["context_from"] == str(text)
    decode = record["contexts"]["300"]["decode"]
    assert len(decode["ar"]["runs"]) == 2 and len(decode["window"]["runs"]) == 1
    assert decode["window"]["identical_to_ar"]
