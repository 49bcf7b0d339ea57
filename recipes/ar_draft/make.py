"""An autoregressive draft model for mlx-lm's own speculative decoding, made
from the built-in target without training: its first N layers with the
target's embedding, final norm and tied head (an early-exit draft, as in
LayerSkip-style self-speculation). `dflash2 bench --ar-draft-model FOLDER`
needs an ordinary small LM with the target's tokenizer, and the project ships
none; this one exists so that arm can be measured. It is not trained for early
exit, so expect low acceptance.

    python recipes/ar_draft/make.py runs/ar_draft --layers 2
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "dflash2_mlx" / "builtin" / "target"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    config = json.loads((TARGET / "config.json").read_text())
    if not 0 < args.layers < config["num_hidden_layers"]:
        sys.exit(f"--layers must be between 1 and {config['num_hidden_layers'] - 1}")
    weights = mx.load(str(TARGET / "model.safetensors"))
    kept = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < args.layers}
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config["num_hidden_layers"] = args.layers
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(tmp / "model.safetensors"), kept, metadata={"format": "mlx"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TARGET / name, tmp / name)
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    print(f"wrote {args.out}: first {args.layers} of the target's layers, {len(kept)} tensors")


if __name__ == "__main__":
    main()
