"""SmolLM2's GGUF weights as a transformers folder, for the recipe's PyTorch answer generator.

    python recipes/smollm2_drafters/export_hf.py OUT_DIR [--model smollm2]

The weights are those of `--model smollm2` (the Q4_1 GGUF, converted as the
command line converts it), dequantized: the same function the drafters are
trained and measured against. The converter already undid llama.cpp's q/k row
permutation, so the layout is transformers' LlamaForCausalLM as it is; the
tokenizer files (with the chat template) are copied as converted.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cli.model_source import model_folder  # noqa: E402  (fetch + convert, as --model does)
from dflash2_mlx.loading.checkpoints import load_target  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()
    from mlx_lm.utils import dequantize_model

    src = Path(model_folder(args.model))
    target, _ = load_target(str(src), activation_dtype=mx.float32)
    model = dequantize_model(target.model)
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise SystemExit(f"{args.model} is a {config.get('model_type')} model: this exporter writes llama only")
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    config.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    args.out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    tmp = args.out / "model.tmp.safetensors"  # renamed last: a folder with model.safetensors is whole
    mx.save_safetensors(str(tmp), weights, metadata={"format": "pt"})
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".jinja":
            shutil.copy(f, args.out / f.name)
    (args.out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    tmp.replace(args.out / "model.safetensors")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
