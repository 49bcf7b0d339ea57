"""Export the latest training checkpoint as the shipped HF-format checkpoint.

Usage: python export.py RUN_DIR OUT_DIR   (needs torch: run in the training venv)

Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json}. Weights are bf16 with HF key
names; the tied lm_head is not stored (tie_word_embeddings=true), which is what
both transformers and mlx-lm expect. Works on any checkpoint, finished or not,
so a run cut short can still be shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from model_config import ARCH  # noqa: E402
from train import BATCH, SEQ  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def main(run: Path, out: Path) -> None:
    ck = torch.load(run / "ckpt.pt", map_location="cpu", weights_only=False)
    sd = ck["model"]
    # Keep parameters only: drop the tied lm_head copy and any rotary buffers.
    weights = {
        k: v.detach().to(torch.bfloat16).contiguous()
        for k, v in sd.items()
        if k.startswith("model.") and "rotary" not in k
    }
    assert "model.embed_tokens.weight" in weights and "model.norm.weight" in weights
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # save_file leaves it owner-only
    cfg = dict(ARCH, torch_dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(run / "tokenizer" / name, out / name)
    n = sum(v.numel() for v in weights.values())
    info = {"step": ck["step"], "total_steps": ck["total_steps"], "elapsed": round(ck["elapsed"], 1),
            "tokens": ck["step"] * BATCH * SEQ, "params": n, "tensors": len(weights),
            "bytes": (out / "model.safetensors").stat().st_size}
    (run / "export.json").write_text(json.dumps(info, indent=1) + "\n")  # for report.py
    print(json.dumps(info))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
