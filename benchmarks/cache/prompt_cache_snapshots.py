"""Bytes the prompt cache keeps per 256-token block, with snapshots every N blocks.

    python benchmarks/cache/prompt_cache_snapshots.py --json benchmarks/results/prompt-cache-snapshots-cpu.json

Two qwen3_5 (Gated DeltaNet + attention) look-alikes with random weights and
a random DFlash 2 drafter, on the backend this runs on:
- `tests`: the suite's look-alike (hidden 64, 4 layers, attention every 2nd,
  linear heads 2 key / 4 value of 16).
- `qwen3_next_shapes`: the per-layer shapes of Qwen/Qwen3-Next-80B-A3B's
  config (attention every 4th layer with 2 KV heads of 256, linear heads
  16 key / 32 value of 128, conv kernel 4) in 4 layers of hidden 64, so the
  ratio of recurrent state to attention rows is the real model's.
For each, a prompt of `--blocks` whole blocks runs through `PromptCache.prepare`
(memory only) with `snapshot_every` 1, 2, 4 and 8, and the bytes of one
block's rows entry and of one snapshot entry are read from the cache.
"""

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "tests": {},
    "qwen3_next_shapes": dict(full_attention_interval=4, head_dim=256, num_attention_heads=16, num_key_value_heads=2,
                              linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                              linear_value_head_dim=128, linear_conv_kernel_dim=4),
}


def load(folder: Path, dims: dict):
    from dflash2_mlx.engine.pair import Pair
    from dflash2_mlx.loading.checkpoints import load_target
    from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, write_target

    write_target(folder, "qwen3_5", **dims)
    target, _ = load_target(str(folder))
    config = json.loads((folder / "config.json").read_text())
    return Pair.make(target, random_drafter(drafter_config_dict(config, "dflash2", block_size=8), seed=1))


def measure(pair, blocks: int, every: int) -> dict:
    from dflash2_mlx.text.prompt_cache import CacheSettings, PromptCache
    from dflash2_mlx.text.prompt_cache.store import snapshot_key

    snapshot = snapshot_key("")  # the suffix of a snapshot entry's key
    pcache = PromptCache(pair, CacheSettings(memory_bytes=1 << 40, snapshot_every=every))
    ids = [(7 * i + 3) % 300 + 5 for i in range(blocks * pcache.S + 1)]
    start = time.perf_counter()
    pcache.prepare(ids)
    seconds = time.perf_counter() - start
    entries = pcache._blocks
    rows = [b.nbytes for k, b in entries.items() if not k.endswith(snapshot)]
    snaps = [b.nbytes for k, b in entries.items() if k.endswith(snapshot)]
    return {"snapshot_every": every, "blocks": len(rows), "snapshots": len(snaps), "rows_bytes_per_block": rows[0],
            "snapshot_bytes": snaps[0], "bytes_kept": pcache.block_bytes,
            "bytes_per_block": round(pcache.block_bytes / len(rows)), "prepare_s": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import mlx.core as mx

    from dflash2_mlx.device import backend_name

    out = {"backend": backend_name(), "machine": platform.machine(), "mlx": mx.__version__, "block_tokens": 256,
           "lookalikes": {}}
    for name, dims in SHAPES.items():
        with tempfile.TemporaryDirectory() as tmp:
            pair = load(Path(tmp), dims)
            rows = [measure(pair, args.blocks, every) for every in (1, 2, 4, 8)]
        out["lookalikes"][name] = rows
        for r in rows:
            print(name, json.dumps(r), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
