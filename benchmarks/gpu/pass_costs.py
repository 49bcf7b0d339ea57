"""What one target pass and one decode cycle cost on this machine.

* `verify_table`: a target pass over R rows (R = 1 is a plain step; 2..16 a
  verify), through the engine's own `forward_undoable` / `rollback` and target
  cache, at a few context lengths. Two modes: `new_length`, where R committed
  rows come before every timed pass, so every pass meets a key length it has not
  seen (what decoding does, and what made verify passes 40-75 ms on the H200);
  and `same_length`, the same pass repeated at one length (undone each time).
* `cycles`: `tools.cycle_profile.cycle_breakdown` (benchmarks/decode/cycle.py's
  measurement): a one-sync cycle against the same cycle with each phase synced.
"""

import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from dflash2_mlx.engine.sampling import SamplingParams
from dflash2_mlx.tools.cycle_profile import cycle_breakdown

MODES = ("new_length", "same_length")


def _fill(target, cache, n: int, chunk: int = 512) -> None:
    ids = mx.random.randint(10, min(target.vocab_size, 4096), (n,), key=mx.random.key(1)).astype(mx.int32)
    for start in range(0, n, chunk):
        target(ids[None, start : start + chunk], cache, (), last_logits_only=True)
        mx.eval([c.state for c in cache])


def _pass_ms(pair, cache, R: int, mode: str, repeats: int, warmup: int, deadline: float) -> list[float]:
    target, times = pair.target, []
    rows = mx.array([[11 + (i % 1000) for i in range(R)]], dtype=mx.int32)
    for i in range(warmup + repeats):
        if time.monotonic() > deadline:
            break
        if mode == "new_length":  # R committed rows: the next pass reads a longer cache
            target(rows, cache, (), last_logits_only=True)
            mx.eval([c.state for c in cache])
        tic = time.perf_counter()
        logits, features, undo = target.forward_undoable(rows, cache, pair.layer_ids)
        mx.eval([a for a in (logits, features) if a is not None])
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - tic))
        target.rollback(cache, undo, 0)
    return times


def verify_table(pair, contexts: list[int], rows: list[int], repeats: int, warmup: int, deadline: float) -> dict:
    """Median ms per pass by mode, context and rows, and verify(16) / plain step per context."""
    table = {m: {} for m in MODES}
    for n in contexts:
        cache = pair.target.make_cache()
        _fill(pair.target, cache, n)
        for mode in MODES:
            for R in rows:
                times = _pass_ms(pair, cache, R, mode, repeats, warmup, deadline)
                trim_prompt_cache(cache, cache[0].offset - n)  # back to n rows for the next size
                if times:
                    table[mode].setdefault(str(n), {})[str(R)] = {"ms_median": statistics.median(times),
                                                                 "ms_runs": [round(t, 3) for t in times]}
        del cache
        mx.clear_cache()
    top = str(max(rows))
    ratios = {m: {n: (round(row[top]["ms_median"] / row["1"]["ms_median"], 4)
                      if top in row and "1" in row else None) for n, row in table[m].items()} for m in MODES}
    return {"rows": rows, "contexts": contexts, "repeats": repeats, "warmup": warmup, "ms": table,
            f"verify{top}_over_plain": ratios}


def cycles(pair, ids: list[int], blocks: list[int], n_cycles: int, deadline: float) -> list[dict]:
    """cycle_breakdown at each block size, with the one-sync cycle over the phase-synced parts."""
    out = []
    for B in blocks:
        if time.monotonic() > deadline:
            break
        rec = cycle_breakdown(pair, ids, cycles=n_cycles, block_size=B, sampling=SamplingParams(temperature=0.0))
        ph = rec["phase_ms"]
        phase_sum = ph["draft"] + ph["select"] + ph["verify"]
        out.append({k: rec[k] for k in ("block_size", "cycles", "cycle_ms_untimed", "cycle_ms_timed", "phase_ms",
                                        "host_syncs_per_cycle", "peak_memory_gb")}
                   | {"phase_sum_ms": phase_sum,
                      "one_sync_over_phase_sum": rec["cycle_ms_untimed"] / phase_sum if phase_sum else None})
    return out
