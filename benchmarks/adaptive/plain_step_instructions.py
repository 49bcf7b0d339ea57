"""What a plain step of `--block-size auto` costs against `--ar`, in instructions.

    python benchmarks/adaptive/plain_step_instructions.py --json benchmarks/results/plain-step-instructions-cpu.json

On this CPU auto decodes plainly (drafting cannot pay here), so auto against
`--ar` is the cost of its plain steps against plain decoding's: the policy's
decision and the capture of the drafter's target layers (so drafting can
resume). Wall-clock ratios of two ~1.5 s runs move by ±15 % on this machine
(its host takes CPU time away), so this counts instructions instead, which
no other load changes: each arm decodes N1 and N2 tokens of the built-in
pair under valgrind's cachegrind, and (count(N2) − count(N1)) / (N2 − N1) is
one step's instructions, start-up and prefill cancelled out. The auto arm is
held in plain-only mode by a cost table where even a fully accepted block
loses, with the real clock (so its online correction runs as in a real run).
The table loses by more than the correction's bounds can move it (each scale
stays within 0.25x-4x): under valgrind the clock runs ~50x slow, the plain
scale rises to its bound, and a table that lost by less made the arm probe
once, which counted a drafting cycle as plain steps.
Needs valgrind (Debian's package); several minutes.
"""

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def fib(n):"


def filled_cache(pair, ids: list[int]):
    """Caches at rest after `ids` (every token but the last), filled with random
    rows instead of a prefill (which would take most of an hour under valgrind):
    a plain step's work depends on how many rows it reads, not on their values."""
    import mlx.core as mx

    from dflash2_mlx.engine.decode.state import DecodeCache

    n, args = len(ids) - 1, pair.target.model.args
    kv, dim = args.num_key_value_heads, getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    cache = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache() if pair.drafter else None)
    dtype = pair.target.activation_dtype
    for c in cache.target:
        c.update_and_fetch(*(mx.random.normal((1, kv, n, dim)).astype(dtype) for _ in "kv"))
    if pair.drafter is not None:  # the drafter's context rows come from target features, as a prefill's do
        features = mx.random.normal((1, n, len(pair.layer_ids) * args.hidden_size))
        pair.drafter.append_context(features, cache.drafter)
    mx.eval([c.state for c in cache.target + (cache.drafter or [])])
    cache.tokens = list(ids)
    return cache


def decode(arm: str, n: int, context: int) -> None:
    """One run (inside valgrind): `n` tokens of the built-in pair, `--ar` or plain-only
    auto; with `context` > 0 after that many context rows (the long-rope look-alike)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from valgrind import tolerate_rlimits

    tolerate_rlimits()
    sys.path.insert(0, str(ROOT))
    from dflash2_mlx import load_pair
    from dflash2_mlx.engine.adaptive.policy import AcceptanceEstimate, BlockPolicy, CostTable
    from dflash2_mlx.engine.decode.loop import generate_step
    from dflash2_mlx.engine.plan import plan
    from dflash2_mlx.engine.request import DecodeRequest

    if context:
        sys.path.insert(0, str(ROOT / "benchmarks" / "long_context"))
        from long_rope import context_ids, long_rope_pair

        tmp = tempfile.TemporaryDirectory()
        pair, tokenizer = long_rope_pair(Path(tmp.name), context + n + 64)
        ids = context_ids(tokenizer, context)
        cache = filled_cache(pair if arm == "auto" else pair.without_drafter(), ids)
        prompt = ids[-1:]
    else:
        pair, tokenizer = load_pair("builtin", "builtin")
        prompt, cache = tokenizer.encode(PROMPT), None
    request = DecodeRequest(max_tokens=n, block_size=None)
    history = max(len(cache.tokens) - 1, 0) if cache is not None else 0
    if arm == "ar":
        plain = pair.without_drafter()
        steps = generate_step(prompt, plain, plan(plain, request, prompt_ids=prompt, history=history),
                              prompt_cache=cache)
    else:
        # A B-block cycle costs 20 B plain steps: it loses even with the plain scale at 4x and the
        # cycle scale at 0.25x (the bounds), so the clock cannot start a probe.
        losing = CostTable(1.0, {B: 20.0 * B for B in (2, 4, 8, 16)}, {B: 0.0 for B in (2, 4, 8, 16)})
        policy = BlockPolicy(losing, pair.max_block_size, AcceptanceEstimate(pair.max_block_size - 1),
                             clock=time.perf_counter)
        decode = replace(plan(pair, request, prompt_ids=prompt, history=history), policy=policy)
        steps = generate_step(prompt, pair, decode, prompt_cache=cache)
    assert sum(len(s.tokens) for s in steps) == n


def instructions(arm: str, n: int, context: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                        sys.executable, __file__, "--decode", arm, str(n), str(context)], check=True,
                       capture_output=True)
        return int(re.search(r"^summary: (\d+)", out.read_text(), re.M).group(1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs=2, default=(30, 130), metavar=("N1", "N2"))
    ap.add_argument("--context", type=int, default=0,
                    help="context rows before decoding (random rows in the long-rope look-alike's caches; "
                         "default 0: the built-in pair after a short prompt)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--decode", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.decode:
        return decode(args.decode[0], int(args.decode[1]), int(args.decode[2]))
    sys.path.insert(0, str(ROOT))
    from dflash2_mlx.device import backend_name
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    n1, n2 = args.tokens
    counts = {arm: {n: instructions(arm, n, args.context) for n in (n1, n2)} for arm in ("ar", "auto")}
    per_step = {arm: (c[n2] - c[n1]) / (n2 - n1) for arm, c in counts.items()}
    ratio = per_step["auto"] / per_step["ar"]
    print(f"instructions per step: --ar {per_step['ar'] / 1e6:.2f} M, auto (plain-only) "
          f"{per_step['auto'] / 1e6:.2f} M: {ratio:.4f}x")
    if args.json:
        record = {**provenance(command_line("python benchmarks/adaptive/plain_step_instructions.py",
                                            sys.argv[1:] if argv is None else argv)),
                  "backend": backend_name(), "machine": platform.machine(), "prompt": PROMPT,
                  "context": args.context,
                  "tokens": [n1, n2], "instructions": {a: {str(n): c for n, c in cs.items()} for a, cs in counts.items()},
                  "instructions_per_step": per_step, "auto_over_ar": ratio}
        atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
