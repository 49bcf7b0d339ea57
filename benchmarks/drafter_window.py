"""How far the drafter's decode path is from the per-query sliding-window rule.

A DFlash 2 look-alike with sliding-window layers (W = 12 by default) drafts one
block over a 40-row context through the library's decode path (`Drafter.__call__`
with its context caches). The reference runs the same layers over the whole
context with the mask written out here, by hand, from the rule the published
references use (z-lab dflash `_attention_mask`, NeMo `_sliding_window_mask`):
block row i, at position p + i, sees key position k iff |p + i - k| < W.
The JSON holds the largest absolute hidden-state difference per block row.

    python benchmarks/drafter_window.py --json out.json [--window 12 --contexts 40 --blocks 8 16]
"""

import argparse
import json
import sys

import mlx.core as mx
import numpy as np

from dflash2_mlx.device import backend_name
from dflash2_mlx.tools.provenance import command_line, provenance
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, target_config


class HandMaskedContext:
    """Every context row as a key, and the per-query rule as an explicit mask."""

    def __init__(self, rows: mx.array, window: int, block: int):
        P = rows.shape[1]
        visible = np.zeros((block, P + block), bool)
        for i in range(block):
            for k in range(P + block):
                visible[i, k] = abs((P + i) - k) < window
        self.rows, self.P, self.mask = rows, P, mx.array(visible)

    def keys_values(self, attn, block=None):
        kc, vc = attn.keys_values(self.rows, 0)
        return kc, vc, self.P, self.mask


def measure(window: int, context: int, block: int, layers: int, seed: int) -> dict:
    cfg = drafter_config_dict(target_config("qwen3"), "dflash2", num_layers=layers, block_size=block,
                              sliding=True)
    cfg.update(sliding_window=window, use_sliding_window=True)
    drafter = random_drafter(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    block_in = mx.array(rng.normal(size=(1, block, cfg["hidden_size"])).astype(np.float32))
    feats = mx.array(rng.normal(size=(1, context, drafter.fc.weight.shape[1])).astype(np.float32))
    got = drafter(block_in, feats, drafter.make_cache())
    h = block_in.astype(drafter.activation_dtype)
    ctx = HandMaskedContext(drafter.project_context(feats.astype(drafter.activation_dtype)), window, block)
    for layer in drafter.layers:
        h = layer(h, ctx)
    want = drafter.norm(h)
    err = np.abs(np.array(got, np.float64) - np.array(want, np.float64)).max(axis=-1)[0]
    return {
        "window": window, "context": context, "block": block, "layers": layers, "seed": seed,
        "dtype": str(drafter.activation_dtype).removeprefix("mlx.core."), "backend": backend_name(),
        "max_abs_error_by_row": [float(e) for e in err], "max_abs_error": float(err.max()),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=12)
    ap.add_argument("--contexts", type=int, nargs="+", default=[40])
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    results = [measure(args.window, p, b, args.layers, args.seed) for p in args.contexts for b in args.blocks]
    for r in results:
        print(f"W={r['window']} context={r['context']} B={r['block']}: max |error| {r['max_abs_error']:.3g} "
              f"(row 0 {r['max_abs_error_by_row'][0]:.3g}, last row {r['max_abs_error_by_row'][-1]:.3g})")
    if args.json:
        with open(args.json, "w") as f:
            command = command_line("python benchmarks/drafter_window.py", sys.argv[1:] if argv is None else argv)
            json.dump({**provenance(command), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
