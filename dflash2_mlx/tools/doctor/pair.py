"""The pair's sections, once both models load: every compatibility check, a
short greedy self-test (acceptance, whether a verify block is bitwise
one-by-one decoding here, and parity), and the decode costs `--block-size auto`
decides with."""

from typing import Optional

from .report import Finding, Section

DEFAULT_MIN_ACCEPTANCE = 0.2


def pair_checks(target, drafter) -> Section:
    from ...engine.pair import compatibility_report

    checks = compatibility_report(drafter, target)
    findings = tuple(Finding(c.name, "ok" if c.ok else "fail", c.message) for c in checks)
    return Section("Target/drafter compatibility", findings,
                   {"drafter_kind": drafter.config.kind, "block_size": drafter.config.block_size})


def self_test(pair, tokenizer, *, block_size: Optional[int] = None, max_tokens: int = 48,
              min_acceptance: float = DEFAULT_MIN_ACCEPTANCE, folder=None, again: bool = False) -> Section:
    """A short greedy generation: refuse near-zero acceptance, check parity. The
    exactness probe (cached under `folder`, probed `again` when asked) says whether
    a divergence is a fault (bitwise) or a near-tie the backend's kernels flipped."""
    from ...engine.adaptive.exactness import load_or_probe
    from ...engine.target.sharded import split_parity
    from ...engine.request import DecodeRequest
    from ...text.generate import stream_generate
    from ...text.prompt import probe_prompt
    from ..compare import first_divergence

    ids = probe_prompt(tokenizer)
    request = DecodeRequest(max_tokens=max_tokens, block_size=block_size)
    spec = list(stream_generate(pair, tokenizer, ids, request))
    ar = [r.token for r in stream_generate(pair.without_drafter(), tokenizer, ids, request)]
    s = spec[-1].stats
    first = s.acceptance_by_position[0] if s.acceptance_by_position else 0.0
    data = {"prompt_tokens": len(ids), "generation_tokens": s.generation_tokens, "block_size": s.block_size,
            "mean_acceptance_length": s.mean_acceptance_length, "acceptance_rate": s.acceptance_rate,
            "acceptance_by_position": s.acceptance_by_position, "first_position_acceptance": first,
            "min_acceptance": min_acceptance}
    line = (f"greedy, {s.generation_tokens} tokens, block {s.block_size}: first-position acceptance {first:.2f}, "
            f"draft acceptance {s.acceptance_rate:.2f} ({s.accepted}/{s.drafted}), mean acceptance length {s.mean_acceptance_length:.2f}")
    if first < min_acceptance:
        findings = [Finding("acceptance", "fail",
                            f"{line}; below --min-acceptance {min_acceptance:.2f}: this drafter does not predict this "
                            "target (trained for another one, broken quantization, or wrong layer ids)")]
    else:
        findings = [Finding("acceptance", "ok", line)]
    exact = load_or_probe(pair, folder, ids, again)
    findings.append(Finding("exactness", "ok" if exact.bitwise else "info", exact.line()))
    # As the probe says it for a backend: what a split over ranks promises for this target's dtype.
    findings.append(Finding("over ranks", "info", f"--processes N: {split_parity(pair.target.activation_dtype)}"))
    data["exactness"] = exact.report()
    diverged = first_divergence(ar, [r.token for r in spec])
    if diverged is None:
        findings.append(Finding("parity", "ok", "greedy DFlash output equals plain greedy decoding"))
    else:
        # A fault where a block is bitwise one-by-one decoding; elsewhere a near-tie can flip.
        findings.append(Finding("parity", "fail" if exact.bitwise else "warn",
                                f"greedy output diverged from plain decoding at token {diverged}"))
    data["parity_index"] = diverged
    return Section("Acceptance self-test", tuple(findings), data)


def decode_costs(pair, tokenizer, folder=None, recalibrate: bool = False) -> Section:
    """The calibration `--block-size auto` decides with: cycle costs by block size
    against a plain decoding step, and how they grow with the context (cached
    under `folder`, measured when missing)."""
    from ...engine.adaptive.calibrate import load_or_calibrate
    from ...engine.target.context import context_limit
    from ...text.prompt import probe_prompt

    cal = load_or_calibrate(pair, folder, probe_prompt(tokenizer), recalibrate)
    where = f"cached in {cal.path}" if cal.cached else (f"measured now, saved to {cal.path}" if cal.path else "measured now")
    contexts = cal.costs.contexts
    first = min(contexts)
    findings = cost_findings(contexts[first], f"after {first} tokens; {where}")
    seed = ", ".join(f"{a:.2f}" for a in cal.acceptance) or "none seen"
    findings.append(Finding("auto", "info", f"acceptance by position on the calibration prompt ({seed}): "
                                            f"{_verdict(cal, pair.max_block_size, first)}"))
    findings += context_findings(cal, pair.max_block_size, context_limit(pair.target))
    findings += batch_findings(cal, pair.max_block_size)
    return Section("Decode costs (--block-size auto)", tuple(findings),
                   {**cal.to_dict(), "path": str(cal.path) if cal.path else None, "cached": cal.cached})


def _verdict(cal, max_block: int, context: int) -> str:
    """What auto would do first at `context` tokens, with the calibration's acceptance."""
    policy = cal.policy(max_block)
    policy.use_context(context)
    B = policy.best_block(max_block)
    lead = policy.rate(B) / policy.rate(1)
    if lead > 1:
        return f"auto would start at block {B} (expected {lead:.2f}x plain decoding)"
    return f"auto would start with plain decoding (best block {B} expected at {lead:.2f}x) and probe now and then"


def context_findings(cal, max_block: int, limit=None) -> list:
    """The costs auto decides with against the context (measured at these lengths,
    interpolated between them and extended past the last, up to the target's
    context `limit`), one line each."""
    contexts = cal.costs.contexts
    if len(contexts) < 2:
        return [Finding("by context", "info", "measured at one context length only (an older calibration: "
                                               "--recalibrate measures a long context too)")]
    findings = []
    longest = max(contexts)
    further = [limit] if limit else [2 * longest, 8 * longest]
    for context in (*contexts, *(n for n in further if n > longest)):
        table = cal.costs.at(context)
        how = "measured" if context in contexts else "extended"
        cycles = ", ".join(f"{B}: {table.cycle(B) / table.plain:.2f}" for B in sorted(table.cycles or table.verify))
        findings.append(Finding(f"{context} tokens", "info",
                                f"{how}: plain step {1e3 * table.plain:.2f} ms; cycle in plain steps by block "
                                f"({cycles}); {_verdict(cal, max_block, context)}"))
    return findings


# Batch sizes doctor shows the batch policy's choice for.
BATCH_SIZES = (1, 2, 4, 8, 16)


def batch_findings(cal, max_block: int) -> list:
    """A batched cycle's cost against the total rows in it, one line per measured size (the
    target pass; the drafter pass were those rows all drafted), the overhead, and what the
    batch policy would choose for 1..16 sequences that accept as the calibration prompt did."""
    from ...engine.adaptive.acceptance import AcceptanceEstimate
    from ...engine.adaptive.batch_policy import SequenceView

    costs = cal.batch
    if costs is None:
        return [Finding("batch", "info", "no batch costs in this calibration (one made by hand)")]
    one = costs.target_cost(1)
    findings = []
    for R, seconds in sorted(costs.target.items()):
        how = "measured" if R in costs.draft else "extended"
        draft = "" if R < 2 else f"; drafter pass over {R} drafted rows {1e3 * costs.draft_cost(R):.2f} ms ({how})"
        findings.append(Finding(f"{R} row{'s' if R > 1 else ''}", "info",
                                f"target pass {1e3 * seconds:.2f} ms ({seconds / one:.1f}x one row){draft}"))
    findings.append(Finding("batch overhead", "info", f"{1e3 * costs.overhead:.2f} ms a cycle (a plain step "
                                                      "less its target pass)"))
    if costs.per_context:
        grow = ", ".join(f"{B}: {1e6 * s:.2f}" for B, s in sorted(costs.per_context.items()))
        findings.append(Finding("batch by context", "info", f"what one sequence's rows add per token of its context "
                                                            f"past {costs.context_from}, in microseconds, by its "
                                                            f"block (1 = a plain row): {grow}"))
    choices = []
    for n in BATCH_SIZES:
        seqs = [SequenceView(256, 0, max_block, AcceptanceEstimate(max_block - 1, cal.acceptance))] * n
        policy = cal.batch_policy()
        blocks = policy.choose(seqs)
        lead = policy.rate(seqs, blocks) / policy.rate(seqs, [1] * n)
        sizes = f"block {blocks[0]}" if min(blocks) == max(blocks) else f"blocks {min(blocks)}-{max(blocks)}"
        choices.append(f"{n}: " + ("all plain" if max(blocks) == 1 else f"{sizes}, {lead:.2f}x plain"))
    findings.append(Finding("batch policy", "info", "for N sequences accepting as the calibration prompt did: "
                                                    + "; ".join(choices)))
    return findings


def cost_findings(costs, where: str = "measured now") -> list:
    """The plain step, a note on what the columns are, and per block size the
    cycle cost auto decides with (`costs.cycle`) beside the parts of it that
    were timed apart. The parts need not add up to the cycle: each was timed
    alone with its own host sync, while a cycle overlaps them, and the cycle
    column is a fit that never falls as B grows."""
    plain = costs.plain
    findings = [Finding("plain step", "info", f"{1e3 * plain:.2f} ms per token ({where})")]
    if costs.cycles:
        how = ("cycle = what auto decides with: a whole cycle as the decode loop runs it, measured whole and "
               "fitted so it never falls as the block grows. verify and draft are measured apart, each with its "
               "own host sync; inside a cycle they overlap, so they need not add up to it")
    else:
        how = ("cycle = what auto decides with: this calibration has no whole-cycle timing, so it is verify + draft, "
               "measured apart with a host sync each (--recalibrate measures whole cycles)")
    findings.append(Finding("how to read", "info", how))
    for B in sorted(costs.cycles or costs.verify):
        cycle = costs.cycle(B)
        never = "" if cycle / plain < B else ", which a block of this size never can"
        findings.append(Finding(
            f"block {B}", "info",
            f"cycle {1e3 * cycle:.2f} ms = {cycle / plain:.2f} plain steps: drafting pays when a cycle commits more "
            f"than {cycle / plain:.2f} tokens{never} · measured apart: verify (target pass over {B} rows) "
            f"{1e3 * costs.verify[B]:.2f} ms, draft (drafter + selector) {1e3 * costs.draft[B]:.2f} ms"))
    return findings
