"""Measure what a decode cycle costs for one pair on this machine, and keep it.

The adaptive block size (adaptive/policy.py) needs the seconds of a plain decoding
step and of a speculative cycle at each block size. They are measured by
running the decode loop itself (so graph building, the host sync and
bookkeeping are counted, not only the passes), plus one timed run per size
that splits a cycle into its target pass and its drafter pass (with the
selector) for display; all of it after a short prompt and after longer
contexts (LONG_CONTEXTS, each at most half the target's context), since
every step reads the whole context (costs.py interpolates between them and
extends the last two: the longer the last, the less a timing's noise is
magnified at 32k).
For batches (batch_policy.py) it also times a bare target pass over R rows
for R in BATCH_ROWS after the short prompt, each undone with target.rollback:
a batched cycle's cost by the total rows in it.
A cycle's cost is a fact of the machine and the pair, so the result is
cached in a JSON file per (backend, device, target, drafter, dtypes,
quantization) and measured again when any of those change.
The caller chooses the folder; the library never looks one up.
"""

import copy
import hashlib
import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx

from ...device import backend_name
from ...errors import DFlashError
from ...files import atomic_write_text
from .acceptance import AcceptanceEstimate
from .batch_policy import BatchCosts, BatchPolicy
from .costs import ContextCosts, Costs, CostTable, costs_from_dict, non_decreasing
from .policy import BlockPolicy
from ..decode.loop import DecodeCache, generate_step
from ..decode.state import DecodePlan, FixedBlock
from ..pair import Pair
from ..request import DecodeRequest
from ..decode.profile import CycleProfiler
from ..target.context import context_limit

VERSION = 4  # 2: costs by context length; 3: batch costs by total rows; 4: a second long context
# Measured block sizes; the policy interpolates between them (linear in B is how
# verify and drafter passes grow, compute-bound or not).
SIZES = (2, 4, 8, 16)
# The long contexts the costs are measured at, each at most half the target's context (past
# the last the policy extends the measured growth linearly, as attention grows). Zero rows
# written into the caches stand for them (no prefill), so a long one costs only its steps'
# time (about 17 s on one CPU core for the built-in pair at 8,192; far less on a GPU). With
# 2,048 alone, 32k was a 17-fold extension of the growth between 256 and 2,048 tokens.
LONG_CONTEXTS = (2048, 8192)
# Seconds one measurement (a block size's cycles, a round of batched passes) aims to take.
MEASURE_BUDGET_S = 2.0
# A first estimate (`first_estimate`): fewer sizes, the short context only, no rows sweep,
# and a tenth of the time per measurement, so a first run answers within seconds.
FIRST_SIZES = (2,)
FIRST_BUDGET_S = 0.2
# Total rows of the target passes timed for batches; the batch policy interpolates
# between them and extends the last two linearly.
BATCH_ROWS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Calibration:
    costs: Costs  # by context length (a ContextCosts), or one CostTable
    acceptance: list[float]  # per draft position, seen on the calibration prompt (a seed)
    key: dict  # what the numbers are valid for
    path: Optional[Path] = None  # where it is cached, if anywhere
    cached: bool = False  # read from disk rather than measured now
    rescaled: Optional[float] = None  # factor applied after a check of the plain step disagreed
    batch: Optional[BatchCosts] = None  # a batched cycle's parts by total rows (None: made by hand)
    complete: bool = True  # False: a first estimate (`first_estimate`), measured fully when asked

    def policy(self, max_block: int, clock=None) -> BlockPolicy:
        """A fresh policy for one generation, seeded with this calibration
        (`clock`, e.g. time.perf_counter, lets it correct the costs online)."""
        return BlockPolicy(self.costs, max_block, AcceptanceEstimate(max_block - 1, self.acceptance), clock=clock)

    def batch_policy(self, clock=None) -> BatchPolicy:
        """A fresh policy for a batch of sequences (`clock` as for `policy`). A calibration
        made without the rows sweep uses its short table: a B-row verify as a B-row pass."""
        costs = self.batch
        if costs is None:
            short = self.costs.at(0)
            costs = BatchCosts({1: short.plain, **short.verify}, dict(short.draft))
        return BatchPolicy(costs, clock=clock)

    def to_dict(self) -> dict:
        d = {"version": VERSION, "key": self.key, "costs": self.costs.to_dict(), "acceptance": self.acceptance,
             "complete": self.complete}
        if self.batch is not None:
            d["batch"] = self.batch.to_dict()
        return d


def calibration_key(pair: Pair) -> dict:
    """Everything the costs depend on: backend, device, both models, dtypes, quantization."""
    try:
        device = mx.device_info().get("device_name", "")
    except Exception:  # older MLX: no device_info
        device = ""
    return {"version": VERSION, "backend": backend_name(), "device": device, **pair.identity()}


def _pass_times(pair: Pair, prompt_ids, policy, passes: int, profiler=None,
                prompt_cache: Optional[DecodeCache] = None) -> tuple[list[float], list]:
    """Seconds between consecutive target passes of the real decode loop (the
    first two are warm-up and dropped), and the speculative steps seen. With
    `prompt_cache` (a long context already read) it decodes from a copy of it."""
    steps, times, last = [], [], None
    if prompt_cache is not None:
        prompt_ids = prompt_cache.tokens[-1:]
        prompt_cache = DecodeCache(copy.deepcopy(prompt_cache.target), copy.deepcopy(prompt_cache.drafter),
                                   list(prompt_cache.tokens), unread=prompt_cache.unread)
    gen = generate_step(prompt_ids, pair, _with_policy(pair, passes * pair.max_block_size + 8, policy),
                        profiler=profiler, prompt_cache=prompt_cache)
    try:
        for i, step in enumerate(gen):
            now = time.perf_counter()
            if last is not None and i > 2:
                times.append(now - last)
                steps.append(step)
            last = now
            if len(times) >= passes:
                break
    finally:
        gen.close()
    return times, steps


def _with_policy(pair: Pair, max_tokens: int, policy) -> DecodePlan:
    """A greedy plan of `max_tokens` whose blocks `policy` picks (a measurement's own: the
    contexts it reads fit the target, `long_contexts`)."""
    return DecodePlan(DecodeRequest(max_tokens=max_tokens, block_size=None), max_tokens, pair.max_block_size,
                      auto=False, policy=policy, tree_rows=0, batch_decides=False, grammar=None, rule=None)


def long_contexts(limit: Optional[int], short: int) -> list[int]:
    """The long contexts to measure at for a target of `limit` positions (None: no
    limit) after a `short`-token prompt: LONG_CONTEXTS, each at most half the limit,
    kept when well past the prompt and the last one kept (a table close to another
    says the same and magnifies its noise when extended)."""
    kept = []
    for n in LONG_CONTEXTS:
        n = n if limit is None else min(limit // 2, n)
        if n >= 4 * short and (not kept or n >= 2 * kept[-1]):
            kept.append(n)
    return kept


def _read_prompt(pair: Pair, prompt_ids: Sequence[int]) -> DecodeCache:
    """Caches at rest after the prompt and its first token: every measurement decodes
    from a copy, so the prompt is read once (a real model's prompt takes seconds on a CPU)."""
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    for _ in generate_step(prompt_ids, pair, _with_policy(pair, 1, FixedBlock(1)), prompt_cache=cache):
        pass
    cache.catch_up(pair.drafter)  # its copies get rows written straight into the drafter cache
    return cache


def _cycles_within(cycles: int, cycle_s: float, least: int = 2, budget_s: float = MEASURE_BUDGET_S) -> int:
    """How many of `cycles` cycles of about `cycle_s` seconds to time: all of them, or as
    many as `budget_s` allows (at least `least`). Where one cycle takes seconds (a
    real model on one CPU core) the full counts took minutes on the first run, and a long
    cycle's timing varies far less than the table needs to tell block sizes apart."""
    return max(least, min(cycles, int(budget_s / max(cycle_s, 1e-9))))


def _read_context(read: DecodeCache, prompt_ids: Sequence[int], n: int) -> DecodeCache:
    """Caches that hold `n` rows: a copy of `read` (the prompt read for real,
    `_read_prompt`), then zero rows written straight into every attention cache,
    target's and drafter's. A step's cost depends on how many rows it reads, not
    on what they hold, and running the target over `n` tokens would make every
    first run wait for a long prefill."""
    cache = DecodeCache(copy.deepcopy(read.target), copy.deepcopy(read.drafter), list(read.tokens))
    pad = n - len(prompt_ids)
    for c in cache.target + cache.drafter:
        state = getattr(c, "state", None)
        if hasattr(c, "update_and_fetch") and state and all(getattr(a, "ndim", 0) == 4 for a in state[:2]):
            k, v = state[0], state[1]  # [1, heads, rows, dims]
            c.update_and_fetch(mx.zeros((*k.shape[:2], pad, k.shape[3]), k.dtype),
                               mx.zeros((*v.shape[:2], pad, v.shape[3]), v.dtype))
        # else a recurrent state: the same size whatever the context
    mx.eval([c.state for c in cache.target + cache.drafter])
    filler = (list(prompt_ids) * (pad // max(len(prompt_ids), 1) + 1))[:pad]
    cache.tokens[-1:-1] = filler
    return cache


def measure(pair: Pair, prompt_ids: Sequence[int], sizes: Sequence[int] = SIZES, cycles: int = 6,
            long: Optional[Sequence[int]] = None, budget_s: float = MEASURE_BUDGET_S,
            rows: bool = True, split: bool = True) -> Calibration:
    """Run the decode loop plainly and at each block size, after the prompt and
    after each long context (`long`, in tokens; None: `long_contexts`, (): none),
    and (`rows`) time batched target passes by total rows; `split`: also a timed
    run per size that splits a cycle into verify and draft (for the doctor and the
    batch costs). A few seconds for each on a small pair; where one cycle takes
    seconds, each measurement is cut to about `budget_s` (`_cycles_within`)."""
    sizes = sorted({B for B in sizes if 2 <= B <= pair.max_block_size} | {2, pair.max_block_size})
    read = _read_prompt(pair, prompt_ids)
    short, acceptance = _costs_at(pair, prompt_ids, sizes, cycles, read, budget_s, split)
    tables = {len(prompt_ids): short}
    for n in long_contexts(context_limit(pair.target), len(prompt_ids)) if long is None else long:
        tables[n], _ = _costs_at(pair, prompt_ids, sizes, cycles, _read_context(read, prompt_ids, n), budget_s,
                                 split)
    batch = batch_costs(pair, prompt_ids, tables) if rows else None
    return Calibration(ContextCosts(tables), acceptance, calibration_key(pair), batch=batch)


def first_estimate(pair: Pair, prompt_ids: Sequence[int]) -> Calibration:
    """A first estimate of the costs, in seconds where `measure` takes minutes (a real
    model on one CPU core): the plain step and the smallest and the largest block after
    the prompt only, briefly, whole cycles only (a cycle's verify / draft split is left
    to the full measurement). The policy corrects its level online (its
    clock) and extends it to longer contexts; `measure` replaces it when asked
    (`load_or_calibrate`: the doctor, the server, --recalibrate)."""
    cal = measure(pair, prompt_ids, FIRST_SIZES, cycles=3, long=(), budget_s=FIRST_BUDGET_S, rows=False, split=False)
    return replace(cal, complete=False)


def batch_costs(pair: Pair, prompt_ids: Sequence[int], tables: dict[int, CostTable]) -> BatchCosts:
    """A batched cycle's parts after the prompt: the target pass by total rows (timed
    now), the drafter pass by drafted rows (the short table's, timed per block size:
    a batch drafts every sequence's block in one pass), the rest of a plain step as the
    per-cycle overhead (the loop's bookkeeping and host sync), and, from the short and
    the long table, what each block size adds per context token (a plain step's growth
    for one row, verify + draft's for a block), never negative (noise)."""
    contexts = sorted(tables)
    short = tables[contexts[0]]
    target = target_rows_costs(pair, prompt_ids)
    per_context = {}
    if len(contexts) > 1:
        long, span = tables[contexts[-1]], contexts[-1] - contexts[0]
        per_context[1] = max(long.plain - short.plain, 0.0) / span
        for B in sorted(set(short.verify) & set(long.verify)):
            grown = long.verify[B] + long.draft[B] - short.verify[B] - short.draft[B]
            per_context[B] = max(grown, 0.0) / span
        per_context = non_decreasing(per_context)
    return BatchCosts(target, dict(short.draft), max(short.plain - target[1], 0.0), per_context, contexts[0])


def target_rows_costs(pair: Pair, prompt_ids: Sequence[int], rows: Sequence[int] = BATCH_ROWS, repeats: int = 3,
                      cache: Optional[list] = None) -> dict[int, float]:
    """Seconds of one target pass over R rows (the drafter's layers captured, as a verify
    does) after the prompt, for each R, each pass undone with `target.rollback`; fitted
    non-decreasing in R. `cache`: an empty target cache to use (default: a new one).
    The sizes take turns, round after round, and each keeps its fastest round: another
    process only ever adds time, and a busy spell that hit one size and not the next
    would bend the table the policy compares sizes by (the online scales correct the level).
    A target with sliding-window layers can undo at most `max_block + 1` rows: larger R
    are left to the policy's linear extension."""
    target = pair.target
    cache = target.make_cache() if cache is None else cache
    mx.eval(target(mx.array([list(prompt_ids)]), cache, (), last_logits_only=True)[0])  # the short context
    room = target.max_block + 1 if target.has_window_layers else max(rows)
    ids = list(prompt_ids) * (max(rows) // max(len(prompt_ids), 1) + 1)
    sizes = [R for R in rows if R <= room]
    seconds = {R: float("inf") for R in sizes}
    rounds, round_ = repeats + 1, 0
    while round_ < rounds:  # round 0 builds each shape's graph: not timed
        took = 0.0
        for R in sizes if round_ % 2 else sizes[::-1]:
            tokens = mx.array([ids[:R]])
            start = time.perf_counter()
            logits, features, undo = target.forward_undoable(tokens, cache, pair.layer_ids)
            mx.eval([a for a in (logits, features) if a is not None])
            elapsed = time.perf_counter() - start
            took += elapsed
            if round_:
                seconds[R] = min(seconds[R], elapsed)
            target.rollback(cache, undo, 0)
        if round_ == 0:
            rounds = 1 + _cycles_within(repeats, took, least=1)
        round_ += 1
    return non_decreasing(seconds)


def _costs_at(pair: Pair, prompt_ids, sizes, cycles: int, cache: Optional[DecodeCache],
              budget_s: float = MEASURE_BUDGET_S, split: bool = True) -> tuple[CostTable, list]:
    """The cost table after the prompt (or after what `cache` has read), and the
    acceptance by position seen on the way."""
    plain = statistics.median(_pass_times(pair, prompt_ids, FixedBlock(1), 3 * cycles, prompt_cache=cache)[0])
    cycle, verify, draft = {}, {}, {}
    M = pair.max_block_size - 1
    reached, hit = [0] * M, [0] * M
    for B in sizes:
        # A cycle costs at most about B plain steps to verify and as much to draft (one CPU core).
        times, steps = _pass_times(pair, prompt_ids, FixedBlock(B), _cycles_within(cycles, 2 * B * plain, 2, budget_s),
                                   prompt_cache=cache)
        cycle[B] = statistics.median(times)
        for s in steps:
            for t in range(min(s.accepted + 1, s.drafted)):
                reached[t] += 1
                hit[t] += t < s.accepted
        if not split:  # the whole cycle only (a first estimate): counted as the verify's
            verify[B], draft[B] = cycle[B], 0.0
            continue
        profiler = CycleProfiler(timed=True)
        _pass_times(pair, prompt_ids, FixedBlock(B), _cycles_within(3, 2 * B * plain, 2, budget_s), profiler,
                    prompt_cache=cache)
        n = profiler.fetches
        verify[B] = profiler.seconds["verify"] / n
        draft[B] = (profiler.seconds["draft"] + profiler.seconds["select"]) / n
    # Positions seen only a few times say little; the estimate extends the last kept one.
    acceptance = []
    for h, r in zip(hit, reached):
        if r < 4:
            break
        acceptance.append(h / r)
    return CostTable(plain, verify, draft, non_decreasing(cycle)), acceptance


# A cached plain step this far off a fresh timing (either way) means the machine
# is not in the state it was calibrated in.
CHECK_TOLERANCE = 1.5


def load_or_calibrate(pair: Pair, folder: Optional[Path], prompt_ids: Sequence[int],
                      recalibrate: bool = False, check: bool = True, first: bool = False) -> Calibration:
    """The cached calibration for this pair on this machine, measured (and
    saved under `folder`, when given) if there is none or `recalibrate`.
    `first`: a first estimate will do (`first_estimate`, measured when nothing
    is cached); otherwise a cached first estimate is measured fully now.

    A cached one is first checked against a few plain steps timed now
    (`check`); when they disagree by more than `CHECK_TOLERANCE` every cost is
    rescaled by the measured factor (the machine was busier or quieter then)
    and saved, and `rescaled` says by how much. Seeded callers pass
    `check=False`: a timing would make their schedule depend on the clock.
    """
    key = calibration_key(pair)
    path = None
    if folder is not None:
        path = calibration_path(pair, folder, key)
        if not recalibrate:
            found = _read(path, key)
            if found is not None and (found.complete or first):
                return checked(pair, found, prompt_ids) if check else found
    cal = first_estimate(pair, prompt_ids) if first and not recalibrate else measure(pair, prompt_ids)
    path = _save(cal, path)
    return Calibration(cal.costs, cal.acceptance, key, path, batch=cal.batch, complete=cal.complete)


def checked(pair: Pair, cal: Calibration, prompt_ids: Sequence[int], passes: int = 6) -> Calibration:
    """`cal`, or `cal` rescaled when a plain step timed now disagrees with it."""
    now = statistics.median(_pass_times(pair, prompt_ids, FixedBlock(1), passes)[0])
    factor = now / cal.costs.at(len(prompt_ids)).plain
    if 1 / CHECK_TOLERANCE <= factor <= CHECK_TOLERANCE:
        return cal
    costs = cal.costs.scaled(factor)
    batch = cal.batch.scaled(factor) if cal.batch is not None else None
    rescaled = Calibration(costs, cal.acceptance, cal.key, cal.path, cached=True, rescaled=factor, batch=batch,
                           complete=cal.complete)
    _save(rescaled, cal.path)
    return rescaled


def _save(cal: Calibration, path: Optional[Path]) -> Optional[Path]:
    """Write `cal` to `path` atomically; None when there is no path or it cannot be written
    (a cache that cannot be written only costs a re-measure next time)."""
    if path is None:
        return None
    try:
        atomic_write_text(path, json.dumps(cal.to_dict(), indent=1) + "\n")
    except DFlashError:
        return None
    return path


def calibration_path(pair: Pair, folder: Path, key: Optional[dict] = None) -> Path:
    """The file under `folder` that holds this pair's calibration on this machine."""
    key = key or calibration_key(pair)
    name = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(folder).expanduser() / f"calibration-{name}.json"


def read_calibration(pair: Pair, folder: Path) -> Optional[Calibration]:
    """The calibration cached under `folder` for this pair on this machine, if any."""
    key = calibration_key(pair)
    return _read(calibration_path(pair, folder, key), key)


def _read(path: Path, key: dict) -> Optional[Calibration]:
    """A cached calibration, or None when missing, unreadable or for another key."""
    try:
        record = json.loads(path.read_text())
        if record.get("key") != key:
            return None
        complete = bool(record.get("complete", True))
        batch = BatchCosts.from_dict(record["batch"]) if complete else None  # a first estimate has no rows sweep
        return Calibration(costs_from_dict(record["costs"]), [float(a) for a in record["acceptance"]],
                           key, path, cached=True, batch=batch, complete=complete)
    except (OSError, ValueError, KeyError, TypeError):
        return None
