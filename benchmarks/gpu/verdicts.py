"""The check's must-show ratios, computed from its JSON record (pure: no MLX).

Each verdict is {"pass": True / False / None, "rule": ..., "values": {...}}:
None where a number it needs was not measured (a step timed out, failed or was
skipped), so a reader sees at once what passed, what failed and what is missing.
"""

from typing import Optional

# (pair, alpha) -> the least block-4 / plain decode speed-up asked for (issue 36).
BLOCK4_GOALS = {("6b", 0.8): 2.0, ("1b", 0.8): 1.6}
CYCLE_LIMIT = 1.25  # one-sync cycle / (draft + select + verify, each synced)
VERIFY_LIMIT = 1.5  # a 16-row verify / a one-row step, ~6B target, key length new every pass
AUTO_GOAL = 0.9  # auto / the best fixed block, per pair and alpha
SERVE_GOAL = 0.95  # dflash2 serve (auto) / dflash2 serve --ar, per client count
SERVE_CLIENTS = (1, 4, 8)


def verdict(rule: str, values: dict, passed: list) -> dict:
    """`passed`: one bool per value checked; pass is None when nothing (or not all) was measured."""
    ok = None if not passed or None in passed else all(passed)
    return {"pass": ok, "rule": rule, "values": values}


def rows_of(record: dict) -> list[dict]:
    return [row for pair in record.get("decode", {}).values() for row in pair.get("rows", [])]


def median_of(rows: list[dict], pair: str, arm: str, alpha: Optional[float]) -> Optional[float]:
    for r in rows:
        if r["pair"] == pair and r["arm"] == arm and r.get("alpha") == alpha:
            return r.get("decode_tps_median")
    return None


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 3)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 4) if a is not None and b else None


def cycle_verdict(record: dict) -> dict:
    values, passed = {}, []
    for pair, runs in record.get("cycle", {}).items():
        for r in runs:
            x = r.get("one_sync_over_phase_sum")
            values[f"{pair} B={r['block_size']}"] = {"one_sync_ms": _round(r.get("cycle_ms_untimed")),
                                                      "phase_sum_ms": _round(r.get("phase_sum_ms")),
                                                      "ratio": _round(x)}
            passed.append(None if x is None else x <= CYCLE_LIMIT)
    return verdict(f"one-sync cycle <= {CYCLE_LIMIT} x the sum of its phase-synced parts "
                   "(draft + select + verify), every pair and block measured", values, passed)


def verify_verdict(record: dict) -> dict:
    table = record.get("verify", {}).get("6b", {})
    values, passed = {}, []
    for context, x in table.get("verify16_over_plain", {}).get("new_length", {}).items():
        values[f"context {context}"] = x
        passed.append(None if x is None else x <= VERIFY_LIMIT)
    return verdict(f"~6B target: a verify of 16 rows <= {VERIFY_LIMIT} x a one-row step, at every context "
                   "measured, the key length new at every pass (as in decoding)", values, passed)


def block4_verdicts(rows: list[dict]) -> dict:
    out = {}
    for (pair, alpha), goal in BLOCK4_GOALS.items():
        x = ratio(median_of(rows, pair, "block 4", alpha), median_of(rows, pair, "plain", None))
        out[f"block4_vs_plain_{pair}_alpha{alpha}"] = verdict(
            f"{pair} target, scripted alpha {alpha}: block 4 decode tok/s >= {goal} x plain",
            {"ratio": x}, [None if x is None else x >= goal])
    return out


def auto_verdict(rows: list[dict]) -> dict:
    values, passed = {}, []
    for pair, alpha in sorted({(r["pair"], r.get("alpha")) for r in rows if r["arm"] == "auto"},
                              key=lambda k: (k[0], k[1] or 0)):
        fixed = {r["arm"]: r.get("decode_tps_median") for r in rows
                 if r["pair"] == pair and r.get("alpha") == alpha and r["arm"].startswith("block ")}
        best = max((v for v in fixed.values() if v is not None), default=None)
        best_arm = next((a for a, v in fixed.items() if v == best), None) if best is not None else None
        x = ratio(median_of(rows, pair, "auto", alpha), best)
        values[pair if alpha is None else f"{pair} alpha {alpha}"] = {"ratio": x, "best_fixed": best_arm}
        passed.append(None if x is None else x >= AUTO_GOAL)
    return verdict(f"auto decode tok/s >= {AUTO_GOAL} x the best fixed block, every pair", values, passed)


def serve_verdict(record: dict) -> dict:
    serve = record.get("serve", {})
    arms = {a["arm"]: {r["clients"]: r["tokens_per_s"] for r in a["runs"]} for a in serve.get("arms", [])}
    values, passed = {}, []
    for c in serve.get("clients", SERVE_CLIENTS):
        x = ratio(arms.get("dflash2", {}).get(c), arms.get("ar", {}).get(c))
        values[f"{c} clients"] = x
        passed.append(None if x is None else x >= SERVE_GOAL)
    return verdict(f"dflash2 serve (auto) aggregate tok/s >= {SERVE_GOAL} x dflash2 serve --ar, built-in pair, "
                   "every client count", values, passed)


def parity_verdict(rows: list[dict]) -> dict:
    diverged = {f"{r['pair']} {r['arm']}" + (f" alpha {r['alpha']}" if r.get("alpha") is not None else ""):
                r["first_divergence"] for r in rows if r.get("first_divergence") is not None}
    checked = [r.get("identical_to_plain") for r in rows]
    return verdict("greedy output token for token equal to plain decoding (first divergence listed otherwise)",
                   {"diverged": diverged, "rows_checked": len(checked)}, checked)


def verdicts(record: dict) -> dict:
    rows = rows_of(record)
    must = {"one_sync_cycle_vs_phase_sum": cycle_verdict(record),
            "verify16_vs_plain_step_6b": verify_verdict(record),
            **block4_verdicts(rows),
            "auto_vs_best_fixed_block": auto_verdict(rows),
            "serve_auto_vs_ar": serve_verdict(record)}
    states = [v["pass"] for v in must.values()]
    return {**must, "all_must_show_pass": None if None in states else all(states),
            "greedy_parity": parity_verdict(rows)}


def table(v: dict) -> str:
    """One line per verdict: PASS / FAIL / n/a, the rule, the numbers."""
    word = {True: "PASS", False: "FAIL", None: "n/a "}
    lines = [f"{word[x['pass']]}  {name}: {x['values']}" for name, x in v.items() if isinstance(x, dict)]
    return "\n".join(lines + [f"all must-show pass: {v.get('all_must_show_pass')}"])
