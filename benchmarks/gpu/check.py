"""Greedy parity and decode speed of plain decoding, fixed blocks and `auto`.

    python benchmarks/gpu/check.py --json docs/results/gpu-check.json [--quick]

Two pairs:
* builtin: the built-in target and DFlash 2 drafter (real acceptance);
* synthetic: a random qwen3 target large enough (about 1B parameters; --quick:
  a small one) that a verify pass of a few rows costs about one row on a GPU,
  with a random drafter whose proposals are scripted: the target's own greedy
  continuation, each position kept with probability --alpha given the earlier
  ones. Its tau therefore comes from the script, not from a trained drafter;
  its costs (drafter pass, verify, bookkeeping) are the real ones.
Runs alternate between configurations (order rotates per round); decode
tokens/s is the median over rounds. Greedy outputs are checked against plain
decoding token for token (on a GPU a B-row pass may use other kernels than a
one-row pass, so a tie can flip: the first differing index is reported).
"""

import argparse
import json
import platform
import random
import statistics
import sys
import time

import mlx.core as mx

from dflash2_mlx.device import backend_name
from dflash2_mlx.engine.adaptive.calibrate import measure
from dflash2_mlx.engine.drafter.model import Drafter
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.target.adapter import Target
from dflash2_mlx.files import atomic_write_text
from dflash2_mlx.text.generate import stream_generate
from dflash2_mlx.tools.provenance import command_line, provenance

PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively."


class ScriptedProposals(Drafter):
    """Runs the real drafter pass, then proposes the reference continuation,
    keeping position t with probability alpha once the earlier ones were kept."""

    def __init__(self, base: Drafter, reference, prompt_len: int, alpha: float, vocab: int, seed: int = 0):
        super().__init__(base.config, fc_in_features=base.fc.weight.shape[1])
        self.update(base.parameters())
        if self.is_dflash2:  # a zero successor codebook makes the walk follow the logits
            sel = self.candidate_selector
            sel.successor_codebook.weight = mx.zeros_like(sel.successor_codebook.weight)
        self.reference, self.prompt_len, self.alpha, self.vocab = reference, prompt_len, alpha, vocab
        self.rng = random.Random(seed)

    def draft(self, block_ids, features, cache, target):
        hidden, _ = super().draft(block_ids, features, cache, target)
        done = cache[0].offset - self.prompt_len + 1
        B = block_ids.shape[1]
        wanted = list(self.reference[done : done + B - 1])
        wanted += [0] * (B - 1 - len(wanted))
        for t in range(B - 1):
            if self.rng.random() >= self.alpha:
                wanted[t] = (wanted[t] + 1) % self.vocab
                break
        logits = 10.0 * (mx.arange(self.vocab)[None, :] == mx.array(wanted)[:, None]).astype(mx.float32)
        return hidden, logits.astype(hidden.dtype)


def run(pair, tokenizer, ids, tokens, block_size, policy_costs=None):
    out, t0 = [], None
    for r in stream_generate(pair, tokenizer, ids, max_tokens=tokens, block_size=block_size,
                             calibration=policy_costs):
        if t0 is None:
            t0 = time.perf_counter()
        out.append(r)
    span = time.perf_counter() - t0
    s = out[-1].stats
    return {"tokens": [r.token for r in out], "decode_tps": (len(out) - 1) / span if span > 0 else 0.0,
            "tau": s.mean_acceptance_length, "block_sizes": getattr(s, "block_sizes", None),
            "plain_share": getattr(s, "plain_share", None)}


def sweep(name, pair, tokenizer, ids, tokens, sizes, rounds, costs):
    configs = [("plain", None)] + [(f"block {B}", B) for B in sizes] + [("auto", "auto")]
    for label, B in configs:  # warm-up
        run(pair if B else pair.without_drafter(), tokenizer, ids, 16, B, costs)
    runs = {label: [] for label, _ in configs}
    for r in range(rounds):
        shift = r % len(configs)
        for label, B in configs[shift:] + configs[:shift]:
            runs[label].append(run(pair if B else pair.without_drafter(), tokenizer, ids, tokens, B, costs))
    ref = runs["plain"][0]["tokens"]
    rows = {}
    for label, rs in runs.items():
        first_diff = next((i for i, (a, b) in enumerate(zip(ref, rs[0]["tokens"])) if a != b), None)
        rows[label] = {"decode_tps": statistics.median(x["decode_tps"] for x in rs),
                       "tau": statistics.mean(x["tau"] for x in rs),
                       "identical_to_plain": first_diff is None and len(ref) == len(rs[0]["tokens"]),
                       "first_difference": first_diff, "block_sizes": rs[-1]["block_sizes"],
                       "plain_share": rs[-1]["plain_share"]}
        print(f"{name} {label}: {rows[label]}", flush=True)
    return rows


def synthetic_pair(quick: bool, alpha: float, tokens: int, tokenizer, ids):
    from mlx_lm.models import qwen3

    from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter

    # The built-in tokenizer (4096 ids) reads the prompt and detokenizes the output.
    H, L, I, V = (256, 4, 768, 4096) if quick else (2048, 16, 8192, 4096)
    config = dict(model_type="qwen3", hidden_size=H, num_hidden_layers=L, intermediate_size=I,
                  num_attention_heads=H // 128 if not quick else 4, num_key_value_heads=max(H // 256, 2),
                  head_dim=128 if not quick else 64, rms_norm_eps=1e-6, vocab_size=V,
                  tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=4096)
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    dtype = mx.float32 if backend_name() == "cpu" else mx.bfloat16
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    target = Target(model)
    n_params = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters()))
    dconf = drafter_config_dict(config, "dflash2", num_layers=1, block_size=16)
    base = random_drafter(dconf)
    base.set_dtype(dtype)
    plain = Pair.make(target)
    reference = [r.token for r in stream_generate(plain, tokenizer, ids, max_tokens=tokens + 32)]
    drafter = ScriptedProposals(base, reference, len(ids), alpha, V)
    return Pair.make(target, drafter), n_params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--quick", action="store_true", help="small sizes: check the script runs (CPU)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.8)
    args = ap.parse_args()
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.prompt import build_prompt

    tokens = 24 if args.quick else args.tokens
    rounds = 1 if args.quick else args.rounds
    sizes = [4, 16] if args.quick else [2, 4, 8, 16]
    record = {**provenance(command_line("python benchmarks/gpu/check.py", sys.argv[1:])),
              "kind": "dflash2-gpu-check", "backend": backend_name(), "platform": platform.platform(),
              "mlx_version": mx.__version__, "quick": args.quick, "tokens": tokens, "rounds": rounds}
    try:
        record["device_name"] = mx.device_info().get("device_name", "")
    except Exception:
        pass
    pair, tokenizer = load_pair("builtin", "builtin")
    ids = build_prompt(tokenizer, PROMPT, None, True, {})
    cal = measure(pair, ids)
    record["builtin"] = {"costs": cal.costs.to_dict(), "acceptance_seed": cal.acceptance,
                         "runs": sweep("builtin", pair, tokenizer, ids, tokens, sizes, rounds, cal)}
    big, n_params = synthetic_pair(args.quick, args.alpha, tokens, tokenizer, ids)
    cal = measure(big, ids)
    record["synthetic"] = {"parameters": n_params, "alpha_scripted": args.alpha, "costs": cal.costs.to_dict(),
                           "runs": sweep("synthetic", big, tokenizer, ids, tokens, sizes, rounds, cal)}
    atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
