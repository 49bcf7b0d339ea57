"""One pair's part of the GPU check: verify costs, cycle breakdown, calibration, decode arms.

The built-in pair (its trained DFlash 2 drafter, real acceptance) or a synthetic
qwen3 target ("1b", "6b"; synthetic_pairs.py) with a scripted drafter at each
alpha in ALPHAS. Every result goes into the JSON as soon as it exists; the work
is ordered so that what the verdicts need comes first, and nothing new starts
past the step's deadline (what was skipped is listed).
"""

import statistics
import time

from decode_arms import arms_for, run_arm, summarise
from pass_costs import cycles, verify_table
from result_file import put
from synthetic_pairs import PROMPT_IDS, expected_tau, greedy_reference, scripted_pair, synthetic_target

PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively."
ALPHAS = (0.8, 0.6)
BLOCKS = [2, 4, 8, 16]
TREE_ROWS = 8
VERIFY_ROWS = [1, 2, 4, 8, 16]


def settings(name: str, quick: bool) -> dict:
    if quick:
        return dict(contexts=[32, 64], repeats=2, warmup=0, cycles=2, warm_tokens=4,
                    calibration=dict(sizes=(2,), cycles=2))
    contexts = [256, 1024] if name == "builtin" else [256, 1024, 4096]
    return dict(contexts=contexts, repeats=10, warmup=2, cycles=12, warm_tokens=16, calibration={})


def load(name: str, quick: bool, tokens: int):
    """(pairs by alpha, prompt ids, plain reference or None, what the JSON says about the models)."""
    if name == "builtin":
        from dflash2_mlx.loading.load_pair import load_pair
        from dflash2_mlx.text.prompt import build_prompt

        pair, tokenizer = load_pair("builtin", "builtin")
        ids = build_prompt(tokenizer, PROMPT, None, True, {})
        return {None: pair}, ids, None, {"target": "builtin", "drafter": f"builtin ({pair.kind})",
                                         "prompt": PROMPT, "chat_template": True}
    target, info = synthetic_target(name, quick)
    ids = PROMPT_IDS[:24] if quick else PROMPT_IDS
    reference = greedy_reference(target, ids, tokens + 32)  # the script's answers; warms the plain path
    pairs = {a: scripted_pair(target, info["config"], reference, len(ids), a) for a in ALPHAS}
    return pairs, ids, reference[:tokens], {**info, "drafter": "random 1-layer DFlash 2, proposals scripted",
                                            "alphas": list(ALPHAS)}


def run_pair(name: str, out, quick: bool, budget_s: float, tokens: int, rounds: int) -> None:
    from dflash2_mlx.engine.adaptive.calibrate import measure

    start = time.monotonic()
    deadline = start + budget_s
    at = lambda share: min(deadline, time.monotonic() + share * budget_s)  # noqa: E731
    s = settings(name, quick)
    pairs, ids, reference, info = load(name, quick, tokens)
    first = next(iter(pairs.values()))
    put(out, ("decode", name, "model"), {**info, "prompt_tokens": len(ids), "tokens": tokens,
                                         "load_s": round(time.monotonic() - start, 2)})
    print(f"{name}: loaded in {info_s(start)}", flush=True)
    tic = time.monotonic()
    table = verify_table(first, s["contexts"], VERIFY_ROWS, s["repeats"], s["warmup"], at(0.15))
    put(out, ("verify", name), {**table, "seconds": round(time.monotonic() - tic, 2)})
    print(f"{name}: verify table in {info_s(tic)}", flush=True)
    tic = time.monotonic()
    put(out, ("cycle", name), cycles(first, ids, [4, 16], s["cycles"], at(0.08)))
    print(f"{name}: cycle breakdown in {info_s(tic)}", flush=True)
    calibrations = {}
    for alpha, pair in pairs.items():
        tic = time.monotonic()
        # The decode runs reach a few hundred tokens: no long-context tables.
        calibrations[alpha] = measure(pair, ids, long=(), **s["calibration"])
        put(out, ("decode", name, "calibration", "trained drafter" if alpha is None else f"alpha {alpha}"),
            {**calibrations[alpha].to_dict(), "seconds": round(time.monotonic() - tic, 2)})
        print(f"{name}: calibration (alpha {alpha}) in {info_s(tic)}", flush=True)
    sweep(name, out, pairs, ids, tokens, rounds, calibrations, reference, s["warm_tokens"], deadline)


def scripted_tau(arm):
    """The script's tau for a fixed chain block (None: no script, a tree or auto)."""
    return expected_tau(arm.alpha, arm.block) if arm.alpha is not None and isinstance(arm.block, int) else None


def info_s(since: float) -> str:
    return f"{time.monotonic() - since:.1f} s"


def sweep(name, out, pairs, ids, tokens, rounds, calibrations, reference, warm_tokens, deadline) -> None:
    alphas = [a for a in pairs if a is not None] or [None]
    arms = arms_for(alphas, BLOCKS, TREE_ROWS)
    runs = {arm.key: [] for arm in arms}
    skipped = []
    for arm in arms:  # warm-up: every arm's graphs built once, untimed
        if time.monotonic() > deadline:
            break
        run_arm(arm, pairs, ids, warm_tokens, calibrations)
    print(f"{name}: warm-ups done", flush=True)
    for r in range(rounds):
        order = arms if r == 0 else arms[r % len(arms):] + arms[: r % len(arms)]
        for arm in order:
            if time.monotonic() > deadline:
                skipped.append(f"round {r} {arm.key}")
                continue
            runs[arm.key].append(run_arm(arm, pairs, ids, tokens, calibrations))
            plain = runs["plain"][0]["tokens"] if runs["plain"] else reference
            plain_tps = statistics.median(x["decode_tps"] for x in runs["plain"]) if runs["plain"] else None
            rows = [summarise(name, a, runs[a.key], plain, plain_tps, scripted_tau(a)) for a in arms if runs[a.key]]
            put(out, ("decode", name, "rows"), rows)
            row = next(x for x in rows if (x["arm"], x["alpha"]) == (arm.name, arm.alpha))
            print(f"{name} round {r} {arm.key}: {runs[arm.key][-1]['decode_tps']:.1f} tok/s, "
                  f"first divergence {row['first_divergence']}", flush=True)
    put(out, ("decode", name, "skipped_for_time"), skipped)
