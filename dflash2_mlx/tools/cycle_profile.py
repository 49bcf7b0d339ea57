"""Where a decode cycle's time goes: drafter forward, selection, target verify,
and everything else (acceptance, the host sync, cache trims, Python).

Two runs over the same prompt: an untimed one gives the real cycle time and
the number of host synchronisations per cycle; a timed one evaluates each
phase as it ends, so its time can be attributed. "Everything else" is the
timed run's cycle wall time minus the three named phases.
"""

import platform
import time
from typing import Optional

import mlx.core as mx

from ..device import backend_name
from ..engine.decode.loop import DecodeCache, generate_step
from ..engine.plan import plan
from ..engine.request import DecodeRequest
from ..engine.pair import Pair
from ..engine.decode.profile import CycleProfiler
from ..engine.sampling import SamplingParams

PHASES = ("draft", "select", "verify")


def _run(pair, prompt, cycles, block_size, sampling, profiler):
    """Decode `cycles` cycles after prefill; returns (seconds per cycle, cache trace)."""
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    request = DecodeRequest(max_tokens=10**9, block_size=block_size, sampling=sampling)
    steps = generate_step(prompt, pair, plan(pair, request, prompt_ids=prompt), prompt_cache=cache, profiler=profiler)
    next(steps)  # prefill and first token: not part of a cycle
    profiler.seconds.clear()
    profiler.fetches = 0
    trace = []
    tic = time.perf_counter()
    for _ in range(cycles):
        next(steps)
        # Committed context (all tokens but the last) vs what the drafter cache holds.
        trace.append((len(cache.tokens) - 1, cache.drafter[0].offset, cache.target[0].offset))
    wall = time.perf_counter() - tic
    steps.close()
    # At rest the drafter may leave its last rows unread (DecodeCache.unread): they count.
    trace.append((len(cache.tokens) - 1, cache.drafter_rows, cache.target[0].offset))
    return wall / cycles, trace


def cycle_breakdown(
    pair: Pair,
    prompt: list[int],
    *,
    cycles: int = 20,
    block_size: Optional[int] = None,
    sampling: SamplingParams = SamplingParams(),
    warmup: int = 3,
) -> dict:
    """Measure one configuration; returns a JSON-ready record."""
    B = pair.block_size(block_size)
    _run(pair, prompt, warmup, B, sampling, CycleProfiler())
    mx.reset_peak_memory()
    untimed = CycleProfiler()
    cycle_s, trace = _run(pair, prompt, cycles, B, sampling, untimed)
    timed = CycleProfiler(timed=True)
    timed_cycle_s, _ = _run(pair, prompt, cycles, B, sampling, timed)
    phases = {p: timed.seconds[p] / cycles for p in PHASES}
    phases["everything_else"] = max(timed_cycle_s - sum(phases.values()), 0.0)
    share = {p: s / timed_cycle_s for p, s in phases.items()}
    lag = [committed - drafted for committed, drafted, _ in trace]
    return {
        "backend": backend_name(),
        "device": platform.machine(),
        "mlx_version": mx.__version__,
        "mode": pair.kind,
        "block_size": B,
        "temperature": sampling.temperature,
        "cycles": cycles,
        "prompt_tokens": len(prompt),
        "cycle_ms_untimed": 1e3 * cycle_s,
        "cycle_ms_timed": 1e3 * timed_cycle_s,
        "phase_ms": {p: 1e3 * s for p, s in phases.items()},
        "phase_share": share,
        "everything_else_share": share["everything_else"],
        "host_syncs_per_cycle": untimed.fetches / cycles,
        "peak_memory_gb": mx.get_peak_memory() / 1e9,
        # The drafter cache holds committed context only: it lags the committed
        # count by the pending rows of the last cycle and never runs ahead.
        "drafter_cache_never_ahead": all(d <= c for c, d, _ in trace),
        "drafter_cache_max_lag_rows": max(lag),
        "drafter_cache_equals_committed_at_close": trace[-1][1] == trace[-1][0] == trace[-1][2],
    }
