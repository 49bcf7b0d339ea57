"""`--block-size auto` against every fixed block where drafting wins: injected costs, real acceptance.

    python benchmarks/adaptive/auto_injected.py --json benchmarks/results/auto-injected-cpu.json

On this CPU no block beats plain decoding, so whether auto finds the best
block where one exists cannot be timed here. This runs the real decode loop
of the long-rope look-alike of the built-in pair (benchmarks/long_context/long_rope.py) on
this checkout's source at each context (so acceptance is the real drafter's
on real text), and charges each target pass to a virtual clock with a cost
table for a machine where verification is cheap (an Apple GPU): a plain step
`plain(c) = PLAIN_MS (1 + c / PLAIN_GROWTH)`, a B-row verify `plain(c) (1 +
VERIFY_ROW (B − 1))` (published M5 Pro numbers for a 27B 4-bit target: 5.7 ms
for one row, 6.3 ms for four) and a draft `DRAFT_MS (1 + c / DRAFT_GROWTH)`
(the drafter attends over the whole context, so drafting loses ground as it
grows). These numbers are an illustration, not a measurement of any Mac.
Auto decides from the same table at two contexts (as its calibration
measures it: short and long, interpolated) and reads the virtual clock, as
it reads the real one. Reported per context: virtual tokens per second of
plain decoding, each fixed block and auto; auto against the best fixed block
and against plain decoding; every arm's tokens must equal plain decoding's.
"""

import argparse
import copy
import json
import platform
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "long_context"))

from long_rope import context_ids, long_rope_pair  # noqa: E402

from dflash2_mlx.engine.adaptive.acceptance import AcceptanceEstimate  # noqa: E402
from dflash2_mlx.engine.adaptive.costs import ContextCosts, CostTable  # noqa: E402
from dflash2_mlx.engine.adaptive.policy import BlockPolicy  # noqa: E402
from dflash2_mlx.engine.decode.loop import DecodeCache, generate_step  # noqa: E402
from dflash2_mlx.engine.decode.state import FixedBlock  # noqa: E402
from dflash2_mlx.engine.plan import plan  # noqa: E402
from dflash2_mlx.engine.request import DecodeRequest  # noqa: E402

PLAIN_MS, PLAIN_GROWTH = 6.0, 32768  # a plain step doubles by 32k tokens of context
VERIFY_ROW = 0.05  # each extra verified row: +5 % of a plain step
DRAFT_MS, DRAFT_GROWTH = 0.8, 4096  # the drafter's pass, growing faster with the context
SIZES = (2, 3, 4, 6, 8, 12, 16)


def table(context: int) -> CostTable:
    plain = PLAIN_MS * (1 + context / PLAIN_GROWTH) / 1e3
    draft = DRAFT_MS * (1 + context / DRAFT_GROWTH) / 1e3
    verify = {B: plain * (1 + VERIFY_ROW * (B - 1)) for B in SIZES}
    return CostTable(plain, verify, {B: draft for B in SIZES})


class Charged:
    """A block policy whose target passes are charged to a virtual clock at the
    injected cost of their block size and context (charged when the next
    decision is recorded, as a real clock would be read then)."""

    def __init__(self, policy):
        self.policy, self.now, self.pending, self.blocks = policy, 0.0, None, {}
        if isinstance(policy, BlockPolicy):
            policy.clock = lambda: self.now

    def choose(self, tokens_left, context=None):
        self.context = context
        return self.policy.choose(tokens_left, context)

    def record(self, decision):
        self.charge()
        self.pending = (decision.block, self.context)
        self.blocks[decision.block] = self.blocks.get(decision.block, 0) + 1
        self.policy.record(decision)

    def charge(self):
        if self.pending is not None:
            B, context = self.pending
            costs = table(context)
            self.now += costs.plain if B == 1 else costs.cycle(B)
            self.pending = None

    def observe(self, drafted, accepted):
        self.policy.observe(drafted, accepted)


def decode_steps(prompt, pair, cache: DecodeCache, policy, max_tokens: int):
    """The decode loop after `cache`, each cycle's block picked by `policy` (up to the drafter's block)."""
    decode = plan(pair, DecodeRequest(max_tokens=max_tokens, block_size=None), prompt_ids=prompt,
                  history=max(len(cache.tokens) - 1, 0))
    return generate_step(prompt, pair, replace(decode, policy=policy), prompt_cache=cache)


def run(pair, cache: DecodeCache, policy, max_tokens: int):
    charged = Charged(policy)
    work = DecodeCache(copy.deepcopy(cache.target), copy.deepcopy(cache.drafter), list(cache.tokens))
    tokens = []
    for step in decode_steps(work.tokens[-1:], pair, work, charged, max_tokens):
        tokens += step.tokens
    charged.charge()
    return tokens, {"virtual_tps": (len(tokens) - 1) / charged.now,
                    "block_sizes": {str(B): n for B, n in sorted(charged.blocks.items())}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from dflash2_mlx.device import backend_name
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    record = {**provenance(command_line("python benchmarks/adaptive/auto_injected.py", sys.argv[1:] if argv is None else argv)),
              "backend": backend_name(), "machine": platform.machine(), "max_tokens": args.max_tokens,
              "costs": {"plain_ms": PLAIN_MS, "plain_growth": PLAIN_GROWTH, "verify_row": VERIFY_ROW,
                        "draft_ms": DRAFT_MS, "draft_growth": DRAFT_GROWTH}, "contexts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        pair, tokenizer = long_rope_pair(Path(tmp), max(args.contexts) + args.max_tokens + 64)
        calibrated = ContextCosts({32: table(32), 2048: table(2048)})  # what a calibration would measure
        for context in args.contexts:
            cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
            for _ in decode_steps(context_ids(tokenizer, context), pair, cache, FixedBlock(1), 1):
                pass
            arms = {"plain": FixedBlock(1), **{f"block_{B}": FixedBlock(B) for B in SIZES},
                    "auto": BlockPolicy(calibrated, pair.max_block_size, AcceptanceEstimate(pair.max_block_size - 1))}
            results, reference = {}, None
            for name, policy in arms.items():
                tokens, stats = run(pair, cache, policy, args.max_tokens)
                reference = reference or tokens
                results[name] = {**stats, "identical_to_plain": tokens == reference}
            best = max((n for n in results if n.startswith("block_")), key=lambda n: results[n]["virtual_tps"])
            row = {"arms": results, "best_fixed": best,
                   "auto_vs_best_fixed": results["auto"]["virtual_tps"] / results[best]["virtual_tps"],
                   "auto_vs_plain": results["auto"]["virtual_tps"] / results["plain"]["virtual_tps"],
                   "best_fixed_vs_plain": results[best]["virtual_tps"] / results["plain"]["virtual_tps"]}
            record["contexts"][str(context)] = row
            print(f"context {context:,}: plain {results['plain']['virtual_tps']:.1f}, best fixed {best} "
                  f"{results[best]['virtual_tps']:.1f} ({row['best_fixed_vs_plain']:.2f}x plain), auto "
                  f"{results['auto']['virtual_tps']:.1f} virtual tok/s ({row['auto_vs_best_fixed']:.2f}x best fixed, "
                  f"{row['auto_vs_plain']:.2f}x plain); blocks {results['auto']['block_sizes']}; identical "
                  f"{all(r['identical_to_plain'] for r in results.values())}", flush=True)
    if args.json:
        atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
