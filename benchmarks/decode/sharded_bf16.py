"""A bfloat16 target split over two ranks against one process: how far the logits move,
and what summing the split projections' partial results in float32 would cost.

    python benchmarks/decode/sharded_bf16.py --json benchmarks/results/sharded-bf16-cpu.json

Writes a bf16 qwen3 look-alike (tools/synthetic.py), runs a 48-token prefill and 20
one-token steps in one process, then under `mlx.launch -n 2 --backend ring` (loopback)
twice: as shipped (each rank rounds its partial sum of `o_proj` / `down_proj` to bf16
before the all_sum) and with the partial sums in float32 (a measurement arm only: the
wrapper's call is swapped in this script's rank processes). Per arm: whether the ranks
agree bitwise, the largest and mean |logit difference| against one process, that largest
relative to the largest |logit|, the share of positions whose top token agrees, and the
seconds of a one-token step (a 2-core machine: both ranks share it).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

PROMPT = [(i * 37 + 11) % 200 for i in range(48)]


def _fp32_partial_sums(self, x):
    """TimedShardedToAll's call with the partial matmul in float32 and one rounding after the sum."""
    import mlx.core as mx

    from dflash2_mlx.engine.target.collectives import QuantizedShardedToAllLinear

    layer, dtype = self.layer, x.dtype
    if isinstance(layer, QuantizedShardedToAllLinear):
        y = mx.quantized_matmul(x.astype(mx.float32), layer["weight"], scales=layer["scales"],
                                biases=layer.get("biases"), transpose=True, group_size=layer.group_size,
                                bits=layer.bits, mode=layer.mode)
    else:
        y = x.astype(mx.float32) @ layer["weight"].astype(mx.float32).T
    y = self._clock.run(lambda v: mx.distributed.all_sum(v, group=layer.group), y).astype(dtype)
    return y + layer["bias"] if "bias" in layer else y


def run_arm(folder: str, arm: str, out: str) -> None:
    """One process (arm "one") or one rank of an arm: the prefill's logits and a step's seconds."""
    import mlx.core as mx

    from dflash2_mlx.engine.target import collectives
    from dflash2_mlx.loading.checkpoints import load_target

    group = None if arm == "one" else mx.distributed.init(strict=True)
    if arm == "fp32_sums":
        collectives.TimedShardedToAll.__call__ = _fp32_partial_sums
    target, _ = load_target(folder, group=group, time_collectives=False)
    cache = target.make_cache()
    logits, _ = target(mx.array([PROMPT]), cache, (), last_logits_only=False)
    mx.eval(logits)
    step = mx.array([[5]])
    times = []
    for _ in range(20):
        tic = time.perf_counter()
        mx.eval(target(step, cache, (), last_logits_only=True)[0])
        times.append(time.perf_counter() - tic)
    rank = 0 if group is None else group.rank()
    Path(f"{out}-{rank}.json").write_text(json.dumps({"logits": logits.astype(mx.float32)[0].tolist(),
                                                      "step_s": float(np.median(times))}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--arm", nargs=3, help=argparse.SUPPRESS)  # folder arm out: one rank's run
    args = ap.parse_args(argv)
    if args.arm:
        return run_arm(*args.arm)
    import mlx.core as mx

    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance
    from dflash2_mlx.tools.synthetic import write_target

    launch = str(Path(sys.executable).with_name("mlx.launch"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    record = {"benchmark": "sharded-bf16", **provenance(command_line(Path(sys.executable).name, sys.argv)),
              "target": "qwen3 look-alike, bfloat16, 4 layers, hidden 64", "prompt_tokens": len(PROMPT), "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(write_target(Path(tmp) / "target", "qwen3", dtype=mx.bfloat16))
        me = [sys.executable, str(Path(__file__).resolve())]
        subprocess.run([*me, "--json", "-", "--arm", folder, "one", f"{tmp}/one"], check=True, env=env)
        one = json.loads(Path(f"{tmp}/one-0.json").read_text())
        ref = np.array(one["logits"])
        record["one_process_step_s"] = one["step_s"]
        for arm in ("bf16_sums", "fp32_sums"):
            subprocess.run([launch, "-n", "2", "--backend", "ring", *me, "--json", "-", "--arm", folder, arm,
                            f"{tmp}/{arm}"], check=True, env=env, timeout=600)
            r0, r1 = (json.loads(Path(f"{tmp}/{arm}-{r}.json").read_text()) for r in (0, 1))
            a, b = np.array(r0["logits"]), np.array(r1["logits"])
            diff = np.abs(a - ref)
            record["arms"][arm] = {
                "ranks_bitwise_equal": bool(np.array_equal(a, b)),
                "max_abs_logit_diff": float(diff.max()), "mean_abs_logit_diff": float(diff.mean()),
                "max_diff_over_logit_scale": float(diff.max() / np.abs(ref).max()),
                "top1_agreement": float((a.argmax(1) == ref.argmax(1)).mean()),
                "step_s": r0["step_s"],
            }
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["arms"], indent=1))


if __name__ == "__main__":
    main()
