"""`--draft-window N` on long contexts: acceptance, decode speed and drafter KV bytes.

    python benchmarks/long_context/draft_window.py --json benchmarks/results/draft-window-cpu.json \
        [--contexts 2048 4096 --windows 256 1024 --max-tokens 64 --block-size 8 --repeats 1]

The built-in pair stops at 2,048 positions, so this runs a look-alike: the
built-in target and DFlash 2 drafter, weights unchanged, with
`max_position_embeddings` raised (`--max-positions`, default 32768) in copies of
their configs. Their RoPE is the default one, so positions past 2,048 are
extrapolated for both sides alike; absolute acceptance there is lower than a
long-context checkpoint's, and what this measures is the window's effect on it.
The context is this checkout's own Python source (dflash2_mlx/, sorted by path),
cut to each length in tokens and fed raw (no chat template), so every run of one
commit reads the same ids.

Per context, T = 0 and a fixed block size, the arms run one after the other in
an order rotating over --repeats: `--ar`, the drafter's own attention (all
rows), and each window. Each run records τ (mean accepted length per target
pass), decode tok/s (mlx-lm's generation_tps), the drafter's cache bytes at the
end (`nbytes` of every layer, what the serve prompt-cache pool counts) and
whether its tokens equal `--ar`'s. Run it on a quiet machine: nothing else may
run while it times.
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx import DecodeRequest, SamplingParams, stream_generate  # noqa: E402
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.decode.state import DecodeCache  # noqa: E402
from dflash2_mlx.engine.drafter.context_caches import SINK_ROWS  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from long_rope import context_ids, long_rope_pair  # noqa: E402


def run(pair, tokenizer, ids, window, block_size, max_tokens) -> tuple[list[int], dict]:
    """One generation; `window` "ar" (no drafter), None (all rows) or N."""
    use = pair.without_drafter() if window == "ar" else pair
    if window != "ar":
        pair.drafter.set_context_window(window)  # read when the drafter cache is made, next line
    cache = DecodeCache(use.target.make_cache(), use.drafter.make_cache() if use.drafter else None)
    request = DecodeRequest(max_tokens=max_tokens, sampling=SamplingParams(),
                            block_size=None if window == "ar" else block_size)
    out = list(stream_generate(use, tokenizer, ids, request, prompt_cache=cache))
    s = out[-1].stats
    drafter_bytes = sum(int(c.nbytes) for c in cache.drafter or [])
    return [r.token for r in out], {
        "tau": s.mean_acceptance_length, "generation_tps": s.generation_tps, "prompt_tps": s.prompt_tps,
        "target_passes": s.target_passes, "drafted": s.drafted, "accepted": s.accepted,
        "generation_tokens": s.generation_tokens, "drafter_kv_bytes": drafter_bytes,
    }


def measure(pair, tokenizer, context: int, windows, args) -> dict:
    ids = context_ids(tokenizer, context)
    arms = ["ar", None, *windows]
    runs = {str(a): [] for a in arms}
    reference = None
    for r in range(args.repeats):
        for arm in arms[r % len(arms):] + arms[: r % len(arms)]:
            tokens, stats = run(pair, tokenizer, ids, arm, args.block_size, args.max_tokens)
            if arm == "ar":
                reference = reference or tokens
            runs[str(arm)].append((tokens, stats))
    result = {}
    for arm, rs in runs.items():
        name = {"ar": "ar", "None": "all_rows"}.get(arm, f"window_{arm}")
        result[name] = {
            "tau": rs[0][1]["tau"],  # deterministic at T = 0: the same in every repeat
            "decode_tps_median": statistics.median(s["generation_tps"] for _, s in rs),
            "drafter_kv_bytes": rs[0][1]["drafter_kv_bytes"],
            "identical_to_ar": all(t == reference for t, _ in rs),
            "runs": [s for _, s in rs],
        }
    line = ", ".join(f"{k} τ {v['tau']:.2f} {v['decode_tps_median']:.1f} tok/s "
                     f"{v['drafter_kv_bytes'] / 2**20:.2f} MiB" for k, v in result.items())
    print(f"context {context:,}: {line}", flush=True)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096], help="context lengths in tokens")
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 1024], help="--draft-window values")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-positions", type=int, default=32768,
                    help="max_position_embeddings of the look-alike (above the longest context)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    if min(args.windows) < 1 or args.repeats < 1 or max(args.contexts) + args.max_tokens > args.max_positions:
        raise SystemExit("error: windows and repeats must be at least 1, and every context plus --max-tokens "
                         "must fit --max-positions")
    with tempfile.TemporaryDirectory() as tmp:
        pair, tokenizer = long_rope_pair(Path(tmp), args.max_positions)
        results = {str(c): measure(pair, tokenizer, c, args.windows, args) for c in args.contexts}
    record = {
        **provenance(command_line("python benchmarks/long_context/draft_window.py", sys.argv[1:] if argv is None else argv)),
        "backend": backend_name(), "machine": platform.machine(), "pair": "builtin look-alike (long rope)",
        "max_positions": args.max_positions, "block_size": args.block_size, "max_tokens": args.max_tokens,
        "repeats": args.repeats, "sink_rows": SINK_ROWS, "windows": args.windows, "contexts": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
