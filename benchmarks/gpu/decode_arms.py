"""Decode arms of one pair, timed in turns, each checked token for token against plain decoding.

Arms: plain (`--ar`: the pair without its drafter, the engine's own plain loop),
`mlx_lm.generate.generate_step` on the same model, fixed blocks, a tree and auto
(a calibration measured on this machine). Every run decodes the same number of
tokens from the same prompt ids at T = 0, through the id-level decode loop (no
tokenizer, so no EOS ends a run early and every arm compares the same count).
Decode tokens/s is counted from the first token on (prefill excluded), as
mlx-lm's generation_tps. Round 0 runs the arms in the order given (the most
wanted first, in case time runs out), later rounds rotate it; medians over rounds.
"""

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Union

import mlx.core as mx

from dflash2_mlx.engine.decode.loop import generate_step
from dflash2_mlx.engine.plan import plan
from dflash2_mlx.engine.request import DecodeRequest


@dataclass(frozen=True)
class Arm:
    name: str  # "plain", "mlx_lm", "block 4", "tree 8", "auto"
    alpha: Optional[float] = None  # the scripted drafter's (None: no drafter, or a trained one)
    block: Union[int, str, None] = None  # a fixed block, "auto", or None for plain / mlx_lm
    tree_rows: int = 0

    @property
    def key(self) -> str:
        return self.name if self.alpha is None else f"{self.name} alpha {self.alpha}"


def arms_for(alphas: list, blocks: list[int], tree_rows: int) -> list[Arm]:
    """Plain and mlx_lm once, then per alpha: block 4 and auto first (the verdicts'), the rest after."""
    first = [b for b in (4,) if b in blocks]
    arms = [Arm("plain"), Arm("mlx_lm")]
    for alpha in alphas:
        arms += [Arm(f"block {b}", alpha, b) for b in first] + [Arm("auto", alpha, "auto")]
        arms += [Arm(f"block {b}", alpha, b) for b in blocks if b not in first]
        arms += [Arm(f"tree {tree_rows}", alpha, None, tree_rows)] if tree_rows else []
    return arms


def timed(steps, token_of: Callable) -> tuple[list[int], float, int]:
    """(tokens, decode tokens/s after the first yield, yields)."""
    tokens, t0, n_first, yields = [], None, 0, 0
    for step in steps:
        tokens += token_of(step)
        yields += 1
        if t0 is None:
            t0, n_first = time.perf_counter(), len(tokens)
    span = time.perf_counter() - t0
    return tokens, (len(tokens) - n_first) / span if span > 0 else 0.0, yields


def run_arm(arm: Arm, pairs: dict, ids: list[int], tokens: int, calibrations: dict) -> dict:
    """One run of `arm`: its tokens, decode tok/s and what the loop did. `pairs[alpha]`: the pair
    (a drafter scripted with that alpha; key None for a trained drafter or the plain arms)."""
    pair = pairs[arm.alpha] if arm.alpha in pairs else next(iter(pairs.values()))
    if arm.name == "mlx_lm":
        from mlx_lm.generate import generate_step as mlx_lm_step

        out, tps, _ = timed(mlx_lm_step(mx.array(ids), pair.target.model, max_tokens=tokens),
                            lambda s: [int(s[0])])
        return {"tokens": out, "decode_tps": tps}
    request, policy = DecodeRequest(max_tokens=tokens, block_size=None), None  # None: the drafter's block
    if arm.block is None and not arm.tree_rows:
        pair = pair.without_drafter()
    elif arm.block == "auto":
        policy = calibrations[arm.alpha].policy(pair.max_block_size, clock=time.perf_counter)
    elif arm.tree_rows:
        request = request.replace(tree_rows=arm.tree_rows)
    else:
        request = request.replace(block_size=arm.block)
    decode = plan(pair, request, prompt_ids=ids)
    if policy is not None:
        decode = replace(decode, policy=policy)
    steps = []
    out, tps, passes = timed(generate_step(ids, pair, decode), lambda s: (steps.append(s), list(s.tokens))[1])
    rows = [s.verify_rows for s in steps[1:]]
    return {"tokens": out, "decode_tps": tps, "target_passes": passes - 1,
            "tau": (len(out) - len(steps[0].tokens)) / max(passes - 1, 1),
            "plain_steps": sum(r == 1 for r in rows),
            "blocks": dict(sorted(_count(s.drafted + 1 for s in steps[1:] if s.drafted).items()))}


def _count(values) -> dict:
    out = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def first_divergence(a: list[int], b: list[int]) -> Optional[int]:
    """First index where the two differ (a shorter one differs where it ends); None if equal."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


def summarise(pair_name: str, arm: Arm, runs: list[dict], plain: Optional[list[int]],
              plain_tps: Optional[float], expected_tau: Optional[float]) -> dict:
    """One row of the JSON: medians over the runs, and parity with plain decoding (every run checked)."""
    tps = [r["decode_tps"] for r in runs]
    med = statistics.median(tps)
    firsts = [first_divergence(plain, r["tokens"]) for r in runs] if plain is not None else []
    diverged = [f for f in firsts if f is not None]
    last = runs[-1]
    return {
        "pair": pair_name, "arm": arm.name, "alpha": arm.alpha, "block_size": arm.block, "tree_rows": arm.tree_rows,
        "runs": len(runs), "decode_tps_median": med, "decode_tps_runs": tps,
        "ms_per_token_median": 1e3 / med if med else None, "x_plain": med / plain_tps if plain_tps else None,
        "tau": statistics.median(r["tau"] for r in runs) if "tau" in last else None, "tau_expected": expected_tau,
        "target_passes": last.get("target_passes"), "plain_steps": last.get("plain_steps"),
        "blocks": last.get("blocks"),
        "tokens_compared": len(runs[0]["tokens"]),
        "identical_to_plain": None if plain is None else not diverged,
        "first_divergence": min(diverged) if diverged else None,
    }
