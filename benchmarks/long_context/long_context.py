"""Long contexts: prefill beside mlx-lm's, decode of --ar, fixed blocks and auto, the drafter window.

    python benchmarks/long_context/long_context.py --json benchmarks/results/long-context-cpu.json \
        [--contexts 1024 4096 16384 32768 --max-tokens 64 --blocks 4 8 16 --draft-window 1024]

On the long-rope look-alike of the built-in pair (benchmarks/long_context/long_rope.py), T = 0.
Per context, two parts:

1. Prefill, each arm in a fresh process (benchmarks/long_context/prefill_arm.py, so each
   peak memory is its own) in an order rotating over --repeats: mlx-lm's
   `stream_generate` on the same target folder, this package's `--ar` and this
   package with the drafter (its block size), all with their defaults. Each
   prefills the context and decodes --max-tokens: prompt tok/s, peak memory
   (from after loading: weights, KV, activations) and decode tok/s, each against
   mlx-lm's. The drafter arm's extra memory is its own (weights and context KV).
2. Decode, in this process: the context is prefilled once per drafter cache
   (all rows, and --draft-window), then every arm continues from it and is
   rewound after (`DecodeCache.truncate`, the same rows as a fresh prefill):
   `--ar`, each fixed block in --blocks, `auto` (calibrated once, on the first
   256 tokens of the context, as the CLI calibrates on a short prompt) and the
   checkpoint's block with --draft-window. Each records decode tok/s (mlx-lm's
   generation_tps), τ, peak memory during the arm (the prefilled caches
   included), the drafter's KV bytes and whether its tokens equal --ar's.
   The window arm runs once whatever --repeats says: its drafter cache cannot
   be rewound past about one block.

--prefill-only runs part 1 alone (contexts whose decode arms take too long); --decode-only
part 2 alone, and --arms picks its arms (e.g. `--arms ar auto --repeats 5`).
--context-from DIR reads the context from DIR's Python files instead of this checkout's
dflash2_mlx/ (whose text changes with every commit): another commit's, to compare two.
--cache-tiers adds time to first token through the block prompt cache: cold,
warm from memory and warm from disk after a restart (a new cache on the same
folder). The same through a real server: benchmarks/cache/prompt_cache_ttft.py. Results are written after each context (atomically), so a run cut
short keeps what it finished. Run it on a quiet machine.
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402

from dflash2_mlx import DecodeRequest, SamplingParams, load_pair, stream_generate  # noqa: E402
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine.adaptive.calibrate import load_or_calibrate  # noqa: E402
from dflash2_mlx.engine.decode.state import DecodeCache  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from long_rope import context_ids, long_rope_folders  # noqa: E402
from prefill_arm import run_arm  # noqa: E402

CALIBRATION_TOKENS = 256


def cache_tier_ttft(pair, tokenizer, ids: list[int], folder: Path, max_tokens: int = 1) -> dict:
    """Time to first token through the block prompt cache (docs/prompt-cache.md): cold (an
    empty folder), warm from memory (the same cache again) and warm from disk after a
    restart (a new cache object on the same folder, nothing in memory). The clock runs
    from `prepare` (which runs the prompt's uncached whole blocks) to the first token."""
    from dflash2_mlx.text.prompt_cache import CacheSettings, PromptCache

    def ask(pcache: PromptCache) -> dict:
        start = time.perf_counter()
        cache, prompt, reuse = pcache.prepare(ids)
        first, tokens = None, []
        request = DecodeRequest(max_tokens=max_tokens, block_size=None)
        for r in stream_generate(pair, tokenizer, prompt, request, prompt_cache=cache):
            first = first if first is not None else time.perf_counter() - start
            tokens.append(r.token)
        pcache.put(cache)
        pcache.flush()
        return {"ttft_s": first, "reused_tokens": reuse.tokens, "disk_tokens": reuse.disk, "tokens": tokens}

    settings = CacheSettings(folder=folder)
    warm = PromptCache(pair, settings)
    rows = {"cold": ask(warm), "memory": ask(warm)}
    rows["disk"] = ask(PromptCache(pair, CacheSettings(memory_bytes=0, folder=folder)))
    for tier in ("memory", "disk"):
        rows[tier]["vs_cold"] = rows[tier]["ttft_s"] / rows["cold"]["ttft_s"]
        rows[tier]["same_tokens"] = rows[tier]["tokens"] == rows["cold"]["tokens"]
    return rows


def prefill_part(folders, context: int, args) -> dict:
    target, drafter = (str(f) for f in folders)
    specs = {"mlx_lm": {"engine": "mlx_lm", "target": target},
             "ar": {"engine": "dflash2", "target": target},
             "drafter": {"engine": "dflash2", "target": target, "drafter": drafter}}
    names, runs = list(specs), {name: [] for name in specs}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            runs[name].append(run_arm({**specs[name], "context": context, "decode": args.max_tokens,
                                       "source": args.context_from and str(args.context_from)}))
    keys = ("prompt_tps", "prompt_cpu_tps", "generation_tps", "decode_cpu_tps", "peak_memory_bytes")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in keys} for n, rs in runs.items()}
    base = med["mlx_lm"]
    return {n: {**m, "prompt_tps_vs_mlx_lm": m["prompt_tps"] / base["prompt_tps"],
                "prompt_cpu_tps_vs_mlx_lm": m["prompt_cpu_tps"] / base["prompt_cpu_tps"],
                "peak_memory_vs_mlx_lm": m["peak_memory_bytes"] / base["peak_memory_bytes"],
                "decode_tps_vs_mlx_lm": m["generation_tps"] / base["generation_tps"],
                "decode_cpu_tps_vs_mlx_lm": m["decode_cpu_tps"] / base["decode_cpu_tps"],
                "weights_bytes": runs[n][0]["weights_bytes"], "target_dtype": runs[n][0]["target_dtype"],
                "tokens_equal_mlx_lm": all(r["tokens"][:len(runs["mlx_lm"][0]["tokens"])] == runs["mlx_lm"][0]["tokens"]
                                           for r in runs[n]),
                "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs[n]]}
            for n, m in med.items()}


def prefilled(pair, tokenizer, ids) -> DecodeCache:
    """Caches holding the context, at rest (every token but the last)."""
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    tic = time.perf_counter()
    for _ in stream_generate(pair, tokenizer, ids, DecodeRequest(max_tokens=1, block_size=None), prompt_cache=cache):
        pass
    cache.truncate(len(ids))
    print(f"  prefilled {len(ids):,} tokens in {time.perf_counter() - tic:.1f} s", flush=True)
    return cache


def decode_arm(pair, tokenizer, ids, cache: DecodeCache, arm: str, args, calibration) -> tuple[list[int], dict]:
    use = pair.without_drafter() if arm == "ar" else pair
    block = int(arm.removeprefix("block_")) if arm.startswith("block_") else ("auto" if arm == "auto" else None)
    mx.reset_peak_memory()
    out, first_cpu = [], None
    request = DecodeRequest(max_tokens=args.max_tokens, sampling=SamplingParams(), block_size=block)
    for r in stream_generate(use, tokenizer, ids[-1:], request, calibration=calibration if arm == "auto" else None,
                             prompt_cache=cache):
        out.append(r)
        first_cpu = time.process_time() if first_cpu is None else first_cpu
    # CPU time from the first token on (what generation_tps counts by the clock): other processes
    # on a shared machine take the clock's time, not this process's CPU time.
    cpu = time.process_time() - first_cpu
    peak = mx.get_peak_memory()
    drafter_bytes = sum(int(c.nbytes) for c in cache.drafter)
    cache.truncate(len(ids))  # back to the prefilled context for the next arm
    s = out[-1].stats
    return [r.token for r in out], {
        "generation_tps": s.generation_tps, "decode_cpu_tps": (len(out) - 1) / cpu if cpu > 0 else None,
        "tau": s.mean_acceptance_length, "target_passes": s.target_passes,
        "generation_tokens": s.generation_tokens, "peak_memory_bytes": peak, "drafter_kv_bytes": drafter_bytes,
        "target_kv_bytes": sum(int(c.nbytes) for c in cache.target),
        # What auto did: cycles by block size (1: a plain step) and why it first fell back.
        "block_sizes": {str(B): n for B, n in sorted((s.block_sizes or {}).items())}, "fallback": s.fallback}


def decode_part(pairs, tokenizer, ids, args, calibration) -> dict:
    full, windowed = pairs
    order = args.arms or ["ar", *(f"block_{b}" for b in args.blocks), "auto", "window"]
    caches = {"all": prefilled(full, tokenizer, ids)}
    if "window" in order:
        caches["window"] = prefilled(windowed, tokenizer, ids)
    runs = {a: [] for a in order}
    for r in range(args.repeats):
        for arm in order[r % len(order):] + order[: r % len(order)]:
            if arm == "window" and r > 0:
                # Its drafter cache keeps about one block beyond the window, so it cannot be rewound
                # by --max-tokens rows for another run: the window arm runs once.
                continue
            pair, cache = (windowed, caches["window"]) if arm == "window" else (full, caches["all"])
            runs[arm].append(decode_arm(pair, tokenizer, ids, cache, arm, args, calibration))
    ref = runs["ar"][0][0]
    ar_tps = statistics.median(s["generation_tps"] for _, s in runs["ar"])
    ar_cpu = statistics.median(s["decode_cpu_tps"] or 0.0 for _, s in runs["ar"])
    out = {}
    for arm, rs in runs.items():
        tps = statistics.median(s["generation_tps"] for _, s in rs)
        cpu_tps = statistics.median(s["decode_cpu_tps"] or 0.0 for _, s in rs)
        out[arm] = {"decode_tps_median": tps, "vs_ar": tps / ar_tps, "decode_cpu_tps_median": cpu_tps,
                    "cpu_vs_ar": cpu_tps / ar_cpu if ar_cpu else None, "tau": rs[0][1]["tau"],
                    "peak_memory_bytes": max(s["peak_memory_bytes"] for _, s in rs),
                    "drafter_kv_bytes": rs[0][1]["drafter_kv_bytes"], "target_kv_bytes": rs[0][1]["target_kv_bytes"],
                    "identical_to_ar": all(t == ref for t, _ in rs), "runs": [s for _, s in rs]}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--draft-window", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-positions", type=int, default=None,
                    help="max_position_embeddings of the look-alike (default: the longest context + --max-tokens)")
    ap.add_argument("--cache-tiers", action="store_true", help="also time to first token warm from memory and disk")
    ap.add_argument("--prefill-only", action="store_true", help="only part 1 (long contexts whose decode arms "
                                                                "would not fit the time at hand)")
    ap.add_argument("--decode-only", action="store_true", help="only part 2 (the decode arms, e.g. repeated)")
    ap.add_argument("--arms", nargs="+", default=None,
                    help="decode arms to run (ar, block_N, auto, window; default: all); 'ar' is the reference")
    ap.add_argument("--context-from", type=Path, default=None,
                    help="a folder whose Python files are the context (default: this checkout's dflash2_mlx/; "
                         "the text changes with every commit, so give another commit's to compare the two)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.arms is not None and "ar" not in args.arms:
        raise SystemExit("error: --arms must include ar (the reference every arm is compared with)")
    positions = args.max_positions or max(args.contexts) + args.max_tokens + 64
    if args.decode_only and args.prefill_only:
        raise SystemExit("error: --decode-only and --prefill-only leave nothing to run: give one of them")
    if args.repeats < 1 or args.max_tokens < 1 or max(args.contexts) + args.max_tokens > positions:
        raise SystemExit("error: --repeats and --max-tokens must be at least 1, and every context plus "
                         "--max-tokens must fit --max-positions")
    record = {**provenance(command_line("python benchmarks/long_context/long_context.py", sys.argv[1:] if argv is None else argv)),
              "backend": backend_name(), "machine": platform.machine(), "processor": platform.processor(),
              "pair": "builtin look-alike (long rope)", "max_positions": positions, "max_tokens": args.max_tokens,
              "blocks": args.blocks, "draft_window": args.draft_window, "repeats": args.repeats,
              "calibration_tokens": CALIBRATION_TOKENS, "prefill_only": args.prefill_only,
              "decode_only": args.decode_only, "arms": args.arms,
              "context_from": str(args.context_from) if args.context_from else None, "contexts": {}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folders = long_rope_folders(Path(tmp), positions)
        full, tokenizer = load_pair(*(str(f) for f in folders))
        windowed, _ = load_pair(*(str(f) for f in folders), draft_window=args.draft_window)
        record["dtype"] = {"target": str(full.target.activation_dtype), "drafter": str(full.drafter.activation_dtype)}
        calibration = None
        for context in args.contexts:
            ids = context_ids(tokenizer, context, args.context_from)
            if calibration is None and not args.prefill_only:
                calibration = load_or_calibrate(full, None, ids[:CALIBRATION_TOKENS])
                # What auto decided from: the measured tables (its costs past them are extended).
                record["calibration"] = {**calibration.costs.to_dict(), "acceptance": calibration.acceptance}
            prefill = None if args.decode_only else prefill_part(folders, context, args)
            if prefill is not None:
                print(f"context {context:,} prefill: " + "; ".join(
                    f"{a} {v['prompt_tps']:.0f} tok/s ({v['prompt_tps_vs_mlx_lm']:.2f}x, CPU time "
                    f"{v['prompt_cpu_tps_vs_mlx_lm']:.2f}x) {v['peak_memory_bytes'] / 1e6:.1f} MB "
                    f"({v['peak_memory_vs_mlx_lm']:.2f}x)" for a, v in prefill.items()), flush=True)
            record["contexts"][str(context)] = {"prefill": prefill}
            if args.prefill_only:
                atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")
                continue
            decode = decode_part((full, windowed), tokenizer, ids, args, calibration)
            print(f"context {context:,} decode: " + "; ".join(
                f"{a} {v['decode_tps_median']:.1f} tok/s (CPU time {v['decode_cpu_tps_median']:.1f}) "
                f"τ {v['tau']:.2f} drafter KV "
                f"{v['drafter_kv_bytes'] / 2**20:.2f} MiB" for a, v in decode.items()), flush=True)
            record["contexts"][str(context)] = {"prefill": prefill, "decode": decode}
            if args.cache_tiers:
                tiers = cache_tier_ttft(full, tokenizer, ids,
                                        Path(tmp) / f"prompt-cache-{context}")
                record["contexts"][str(context)]["ttft"] = tiers
                print(f"context {context:,} time to first token: " + ", ".join(
                    f"{t} {v['ttft_s']:.3f} s" + (f" ({v['vs_cold']:.3f}x cold)" if t != "cold" else "")
                    for t, v in tiers.items()), flush=True)
            atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
