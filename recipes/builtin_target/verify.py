"""Verify the shipped target with the MLX stack (run in the MLX venv, no torch).

Usage: python verify.py [MODEL_DIR] [--ref RUN_DIR/ref_logits.npz] [--out verify.json]

Checks: mlx_lm.load accepts the checkpoint; the tokenizer round-trips code
(indentation included) and has EOS and the mask token inside the embedding;
the weights file is bf16, tied, < 10 MB; a greedy continuation of a prompt;
and, with --ref (from torch_ref.py), that MLX's fp32 logits match
transformers' on the same held-out window.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import generate, load

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "dflash2_mlx" / "builtin" / "target"
PROMPT = "def fib(n):"
# Indentation of several depths, a tab, blank lines, trailing spaces, a string
# with escapes: the things a lossy tokenizer would mangle.
ROUND_TRIP = (
    "class A:\n    def f(self, x):\n        if x:\n\t\treturn {'a': [1, 2]}  \n\n"
    "        return \"\\n\".join(x)   # done\n\n\n\nprint(  A().f(None) )\n"
)
LOGIT_TOL = 1e-3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", nargs="?", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--ref", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    res: dict = {}

    st = mx.load(str(args.model_dir / "model.safetensors"))
    assert "lm_head.weight" not in st, "tied model must not store lm_head"
    assert all(v.dtype == mx.bfloat16 for v in st.values()), "weights must be bf16"
    res["safetensors_bytes"] = (args.model_dir / "model.safetensors").stat().st_size
    assert res["safetensors_bytes"] < 10_000_000
    res["params"] = int(sum(v.size for v in st.values()))

    model, tok = load(str(args.model_dir))
    model.set_dtype(mx.float32)  # bf16 storage, fp32 compute
    cfg = json.loads((args.model_dir / "config.json").read_text())
    rows = model.model.embed_tokens.weight.shape[0]
    res["vocab_size"] = rows
    res["eos_id"] = tok.eos_token_id
    res["mask_id"] = tok.convert_tokens_to_ids("<|mask|>")
    assert tok.eos_token == "<|endoftext|>" and res["eos_id"] == cfg["eos_token_id"]
    assert 0 <= res["mask_id"] < rows and res["mask_id"] != res["eos_id"]
    assert len(tok.encode("<|mask|>")) == 1  # stays one token inside text too

    assert tok.decode(tok.encode(ROUND_TRIP)) == ROUND_TRIP, "tokenizer round-trip failed"
    res["round_trip"] = True

    ids = tok.encode(PROMPT)
    text = generate(model, tok, ids, max_tokens=64, verbose=False)  # default sampler: greedy
    res["prompt"], res["greedy_continuation"] = PROMPT, text
    print(PROMPT + text)
    print("-" * 40)

    if args.ref:
        ref = np.load(args.ref)
        logits = model(mx.array(ref["ids"])[None])[0].astype(mx.float32)
        diff = float(np.abs(np.array(logits) - ref["logits"]).max())
        res["logit_max_abs_diff_vs_torch"] = diff
        res["logit_ref_max_abs"] = float(np.abs(ref["logits"]).max())
        res["argmax_agreement"] = float((np.array(logits).argmax(-1) == ref["logits"].argmax(-1)).mean())
        assert diff < LOGIT_TOL, f"mlx vs torch logits differ by {diff}"

    print(json.dumps({k: v for k, v in res.items() if k != "greedy_continuation"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    print("verify: OK")


if __name__ == "__main__":
    main()
