"""One prefill arm in a fresh process, so its peak memory is its own.

    python benchmarks/long_context/prefill_arm.py '{"engine": "mlx_lm", "target": DIR, "context": 4096, ...}'

prints one JSON line. The spec's keys: `engine` ("mlx_lm": mlx-lm's
`stream_generate` on the target folder; "dflash2": this package's), `target`,
`drafter` (a folder or null: --ar), `dtype` (the target's activation dtype:
"float32", "bfloat16" or null for the package's default), `step`
(prefill_step_size; null for each engine's default), `context` (prompt
tokens), `decode` (tokens to decode after the prompt, greedy), `block_size`
(with a drafter; null for the checkpoint's). Peak memory counts from after
loading (the weights stay resident, so they are in it) through prefill and
decode; `weights_bytes` is what was resident after loading. `prompt_cpu_tps`
counts the prompt against this process's CPU time up to the first token (as
`prompt_tps` counts it against the clock): on a shared machine, where other
processes take the clock's time, it is the steadier of the two;
`decode_cpu_tps` counts the decoded tokens after the first the same way.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402

from long_rope import context_ids  # noqa: E402


def _mlx_lm(spec: dict) -> dict:
    from mlx_lm import load, stream_generate

    model, tokenizer = load(spec["target"])
    ids = context_ids(tokenizer, spec["context"], spec.get("source"))
    weights = mx.get_active_memory()
    mx.reset_peak_memory()
    step = {"prefill_step_size": spec["step"]} if spec.get("step") else {}
    tokens, cpu = [], time.process_time()
    for r in stream_generate(model, tokenizer, ids, max_tokens=spec["decode"] + 1, **step):
        cpu, first = (cpu, first) if tokens else (time.process_time() - cpu, time.process_time())
        tokens.append(r.token)
    return {"prompt_tps": r.prompt_tps, "prompt_cpu_tps": len(ids) / cpu,
            "decode_cpu_tps": (len(tokens) - 1) / max(time.process_time() - first, 1e-9),
            "generation_tps": r.generation_tps, "tokens": tokens,
            "peak_memory_bytes": mx.get_peak_memory(), "weights_bytes": weights,
            "target_dtype": str(model.model.embed_tokens.weight.dtype)}


def _dflash2(spec: dict) -> dict:
    from dflash2_mlx import DecodeRequest, Pair, stream_generate
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target

    dtype = getattr(mx, spec["dtype"]) if spec.get("dtype") else None
    target, tokenizer = load_target(spec["target"], activation_dtype=dtype)
    drafter = load_drafter(spec["drafter"]) if spec.get("drafter") else None
    pair = Pair.make(target, drafter)
    mx.eval(target.model.parameters(), drafter.parameters() if drafter else [])  # the cast is lazy
    ids = context_ids(tokenizer, spec["context"], spec.get("source"))
    weights = mx.get_active_memory()
    mx.reset_peak_memory()
    request = DecodeRequest(max_tokens=spec["decode"] + 1, block_size=spec.get("block_size"),
                            prefill_step_size=spec.get("step") or None)
    out, cpu = [], time.process_time()
    for r in stream_generate(pair, tokenizer, ids, request):
        cpu, first = (cpu, first) if out else (time.process_time() - cpu, time.process_time())
        out.append(r)
    s = out[-1].stats
    return {"prompt_tps": s.prompt_tps, "prompt_cpu_tps": len(ids) / cpu,
            "decode_cpu_tps": (len(out) - 1) / max(time.process_time() - first, 1e-9),
            "generation_tps": s.generation_tps, "tokens": [r.token for r in out],
            "peak_memory_bytes": mx.get_peak_memory(), "weights_bytes": weights,
            "target_dtype": str(target.activation_dtype), "tau": s.mean_acceptance_length,
            "drafter_dtype": str(drafter.activation_dtype) if drafter else None}


def run_arm(spec: dict, timeout: float = 3600) -> dict:
    """Run one arm in a child process; its result, with the wall time of the whole child."""
    tic = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"error: arm {spec} failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "child_wall_s": round(time.perf_counter() - tic, 2)}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps((_mlx_lm if spec["engine"] == "mlx_lm" else _dflash2)(spec)))
