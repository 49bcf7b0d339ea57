"""Structured output inside speculation: tau and decode tok/s, constrained vs not.

    python benchmarks/decode/structured.py --json benchmarks/results/structured-cpu.json

Built-in pair, T = 0, a fixed block (default 8: `auto` decodes plainly on a
CPU, where a cycle costs more than it commits), the same prompts in three
arms, one after the other in a rotating order per repeat: DFlash 2 under a
JSON schema, DFlash 2 free, and plain decoding under the schema (what the
constrained arm must equal token for token, checked). tau is committed
tokens per target pass (`mean_acceptance_length`). The grammar's cost is the
time spent in llguidance's matcher (masks, forced tokens, consume, rollback;
timed around each call) per speculative cycle, against the cycle's time.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dflash2_mlx import DecodeRequest, SamplingParams, load_pair, stream_generate  # noqa: E402
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.engine import grammar as grammar_module  # noqa: E402
from dflash2_mlx.engine.grammar import Grammar  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "version", "deps", "license"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
                         "deps": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 16}},
                         "license": {"enum": ["MIT", "Apache-2.0", "BSD-3-Clause"]}}}
PROMPTS = ("config = ", "def metadata():\n    return ", "# package.json\n", "PACKAGE = ")


class MatcherClock:
    """Seconds spent inside GrammarState's matcher calls (installed around the class's methods)."""

    def __init__(self):
        self.seconds = 0.0
        cls = grammar_module.GrammarState
        self._saved = {name: getattr(cls, name) for name in ("allowed", "advance", "rollback", "forced")}
        for name, fn in self._saved.items():
            setattr(cls, name, self._timed(fn))

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
        return wrapper


def run(pair, tokenizer, prompt, arm, block, max_tokens, clock):
    use = pair.without_drafter() if arm == "constrained_plain" else pair
    grammar = None if arm == "free_dflash2" else Grammar.json_schema(SCHEMA)
    clock.seconds = 0.0
    request = DecodeRequest(max_tokens=max_tokens, sampling=SamplingParams(),
                            block_size=None if arm == "constrained_plain" else block, grammar=grammar)
    out = list(stream_generate(use, tokenizer, tokenizer.encode(prompt), request))
    s = out[-1].stats
    decode_s = (len(out) - 1) / s.generation_tps if s.generation_tps else 0.0
    return [r.token for r in out], {
        "tokens": len(out), "tau": s.mean_acceptance_length, "decode_tps": s.generation_tps,
        "target_passes": s.target_passes, "grammar_s": clock.seconds,
        # Per cycle and per decode alike: the matcher's seconds over the decode's.
        "grammar_share_of_cycle": clock.seconds / decode_s if decode_s else None,
        "text": "".join(r.text for r in out)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    pair, tokenizer = load_pair("builtin", "builtin")
    clock = MatcherClock()
    arms = ("constrained_dflash2", "free_dflash2", "constrained_plain")
    results = {}
    for prompt in PROMPTS:
        runs = {arm: [] for arm in arms}
        for r in range(args.repeats):
            for arm in arms[r % 3:] + arms[: r % 3]:
                runs[arm].append(run(pair, tokenizer, prompt, arm, args.block_size, args.max_tokens, clock))
        same = all(t == runs["constrained_plain"][0][0] for t, _ in runs["constrained_dflash2"] + runs["constrained_plain"])
        med = {arm: {k: statistics.median(s[k] for _, s in rs) for k in ("tau", "decode_tps")}
               for arm, rs in runs.items()}
        share = statistics.median(s["grammar_share_of_cycle"] for _, s in runs["constrained_dflash2"])
        results[prompt] = {"median": med, "grammar_share_of_cycle": share,
                           "constrained_equals_constrained_plain": same,
                           "output": runs["constrained_dflash2"][0][1]["text"],
                           "runs": {arm: [s for _, s in rs] for arm, rs in runs.items()}}
        print(f"{prompt!r}: tau constrained {med['constrained_dflash2']['tau']:.2f} vs free "
              f"{med['free_dflash2']['tau']:.2f}; tok/s {med['constrained_dflash2']['decode_tps']:.1f} / "
              f"{med['free_dflash2']['decode_tps']:.1f} / plain {med['constrained_plain']['decode_tps']:.1f}; "
              f"grammar {share:.1%} of a cycle; equal to constrained plain: {same}", flush=True)
    record = {**provenance(command_line("python benchmarks/decode/structured.py", sys.argv[1:] if argv is None else argv)),
              "backend": backend_name(), "machine": platform.machine(), "block_size": args.block_size,
              "max_tokens": args.max_tokens, "repeats": args.repeats, "schema": SCHEMA, "prompts": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
