"""Extra memory the target keeps to undo a verify forward, measured and by formula.

    python benchmarks/cache/rollback_memory.py --json benchmarks/results/rollback-memory-cpu.json

For synthetic hybrid (qwen3_5, qwen3_next) and sliding-window (muse_glimmer)
targets it runs real speculative decoding (random DFlash 2 drafter, block 16)
and records, per cycle, the bytes the recurrent snapshot holds (state arrays
before verify + the verify rows' layer inputs) and the bytes of the rows the
sliding-window caches keep beyond their window; it also measures MLX's active
memory with and without one snapshot alive, and the mean time of a verify
forward and of a rollback (the recurrent mixers re-run over the accepted rows;
a random drafter gets almost nothing accepted, so most replays are one row). Each number is checked against
the formula in docs/rollback.md, which is then evaluated at the full-size
mlx-lm `ModelArgs` defaults (a formula, not a measured checkpoint).
"""

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx.core as mx  # noqa: E402

from dflash2_mlx.engine.target.caches import RecurrentCache, WindowKVCache  # noqa: E402
from dflash2_mlx.engine.decode.loop import generate_step  # noqa: E402
from dflash2_mlx.engine.plan import plan  # noqa: E402
from dflash2_mlx.engine.request import DecodeRequest  # noqa: E402
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.pair import Pair  # noqa: E402
from dflash2_mlx.loading.checkpoints import load_target  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, write_target  # noqa: E402
from dflash2_mlx.engine.target.adapter import Target  # noqa: E402

B = 16
LINEAR = dict(linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=64,
              linear_value_head_dim=64, linear_conv_kernel_dim=4, full_attention_interval=4)
TARGETS = {
    "qwen3_5": dict(hidden_size=256, num_hidden_layers=8, **LINEAR),
    "qwen3_next": dict(hidden_size=256, num_hidden_layers=8, **LINEAR),
    "muse_glimmer": dict(hidden_size=256, num_hidden_layers=8, sliding_window=64, tie_word_embeddings=False),
}


def recurrent_formula(args, n_rec: int, L: int, act_bytes: int) -> int:
    """n_rec × ((K-1)·conv_dim·b + Hv·Dv·Dk·4 + L·Ht·b): conv state, fp32 delta state, inputs."""
    conv_dim = 2 * args.linear_num_key_heads * args.linear_key_head_dim + args.linear_num_value_heads * args.linear_value_head_dim
    state = args.linear_num_value_heads * args.linear_value_head_dim * args.linear_key_head_dim * 4
    return n_rec * ((args.linear_conv_kernel_dim - 1) * conv_dim * act_bytes + state + L * args.hidden_size * act_bytes)


def window_formula(args, n_sliding: int, max_block: int, act_bytes: int) -> int:
    """n_sliding × max_block × 2 × n_kv_heads × head_dim × b: the rows beyond the window."""
    return n_sliding * max_block * 2 * args.num_key_value_heads * args.head_dim * act_bytes


class MeasuringTarget(Target):
    """Records what each rollback holds (the snapshot is complete by then), and
    times verify forwards and rollbacks (each evaluated on its own)."""

    def __init__(self, base: Target):
        super().__init__(base.model, base.max_block)
        self.snapshot_bytes, self.window_bytes, self.verify_s, self.rollback_s = [], [], [], []

    def _forward(self, tokens, cache, layer_ids, last_logits_only, record):
        tic = time.perf_counter()
        out = super()._forward(tokens, cache, layer_ids, last_logits_only, record)
        if tokens.shape[1] == B:
            mx.eval(out, [c.state for c in cache])
            self.verify_s.append(time.perf_counter() - tic)
        return out

    def rollback(self, cache, undo, keep):
        snapshot = undo.snapshot
        self.snapshot_bytes.append(0 if snapshot is None else snapshot.nbytes)
        self.window_bytes.append(sum(c.extra_nbytes for c in cache if isinstance(c, WindowKVCache)))
        tic = time.perf_counter()
        super().rollback(cache, undo, keep)
        mx.eval([c.state for c in cache])
        self.rollback_s.append(time.perf_counter() - tic)


def active_delta(target: Target, prompt: list[int]) -> int:
    """MLX active memory with one evaluated snapshot alive minus without it."""
    cache = target.make_cache()
    mx.eval(target(mx.array([prompt]), cache)[0])
    logits, features, undo = target.forward_undoable(mx.array([prompt[:B]]), cache)
    snapshot = undo.snapshot
    mx.eval(logits, [c.state for c in cache], snapshot.inputs)
    del logits, features, undo
    gc.collect()
    held = mx.get_active_memory()
    del snapshot
    gc.collect()
    return held - mx.get_active_memory()


def measure(root: Path, family: str) -> dict:
    folder = write_target(root / family, family, **TARGETS[family])
    config = json.loads((folder / "config.json").read_text())
    drafter = random_drafter(drafter_config_dict(config, "dflash2", block_size=B), seed=1)
    base, _ = load_target(str(folder))
    target = MeasuringTarget(base)
    prompt = [(7 * i) % 300 + 1 for i in range(100)]
    pair = Pair.make(target, drafter)
    for _ in generate_step(prompt, pair, plan(pair, DecodeRequest(max_tokens=200, block_size=B), prompt_ids=prompt)):
        pass
    args, cache = target.args, target.make_cache()
    b = target.activation_dtype.size
    n_rec = sum(isinstance(c, RecurrentCache) for c in cache)
    n_sliding = sum(isinstance(c, WindowKVCache) for c in cache)
    expected = recurrent_formula(args, n_rec, B, b) if n_rec else window_formula(args, n_sliding, B, b)
    measured = max(target.snapshot_bytes) if n_rec else max(target.window_bytes)
    record = dict(family=family, config={k: v for k, v in TARGETS[family].items()}, block_size=B,
                  cycles=len(target.snapshot_bytes), recurrent_layers=n_rec, sliding_layers=n_sliding,
                  measured_bytes_per_cycle_max=measured, formula_bytes=expected, matches=measured == expected,
                  verify_ms_mean=1e3 * sum(target.verify_s) / len(target.verify_s),
                  rollback_ms_mean=1e3 * sum(target.rollback_s) / len(target.rollback_s))
    if n_rec:
        record["active_memory_delta_one_snapshot"] = active_delta(target, prompt)
    return record


def full_size_formulas() -> list[dict]:
    from mlx_lm.models import muse_glimmer, qwen3_5

    q = qwen3_5.TextModelArgs()
    n_rec = sum((i + 1) % q.full_attention_interval != 0 for i in range(q.num_hidden_layers))
    m = muse_glimmer.ModelArgs()
    n_sliding = m.layer_types.count("sliding_attention")
    return [
        dict(family="qwen3_5 (mlx-lm TextModelArgs defaults, bf16, B=16)", recurrent_layers=n_rec,
             formula_bytes=recurrent_formula(q, n_rec, 16, 2)),
        dict(family="muse_glimmer (mlx-lm ModelArgs defaults, bf16, max_block=16)", sliding_layers=n_sliding,
             formula_bytes=window_formula(m, n_sliding, 16, 2)),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(Path(tmp), family) for family in TARGETS]
    result = dict(**provenance(command_line("python benchmarks/cache/rollback_memory.py", sys.argv[1:])),
                  backend=backend_name(), measured=runs, full_size=full_size_formulas())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(text + "\n")


if __name__ == "__main__":
    main()
