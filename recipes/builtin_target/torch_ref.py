"""Load the exported checkpoint with transformers (fp32) and record references.

Usage: python torch_ref.py RUN_DIR EXPORT_DIR   (training venv: needs torch)

Checks that transformers' Qwen3ForCausalLM.from_pretrained accepts the export,
measures the shipped (bf16-rounded) weights' held-out loss, and saves the logits
of one held-out window to RUN_DIR/ref_logits.npz, which verify.py compares with
MLX's (the MLX venv has no torch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM

torch.set_num_threads(1)
SEQ = 256


def main(run: Path, export: Path) -> None:
    model = Qwen3ForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    held = torch.from_numpy(np.load(run / "heldout.npy").astype(np.int64))
    n = (len(held) - 1) // SEQ
    wins = torch.stack([held[i * SEQ : i * SEQ + SEQ + 1] for i in range(n)])
    tot = 0.0
    with torch.no_grad():
        for i in range(0, n, 32):
            x = wins[i : i + 32]
            lg = model(input_ids=x[:, :-1]).logits
            tot += F.cross_entropy(lg.reshape(-1, lg.size(-1)), x[:, 1:].reshape(-1)).item() * len(x)
        ids = wins[0, :SEQ]
        ref = model(input_ids=ids[None]).logits[0].numpy()
    np.savez(run / "ref_logits.npz", ids=ids.numpy(), logits=ref)
    res = {"export_heldout_loss_fp32": round(tot / n, 4), "heldout_windows": n}
    (run / "export_eval.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
