"""The long-rope look-alike of the built-in pair and the long contexts fed to it.

The built-in pair stops at 2,048 positions. Its look-alike is the built-in
target and DFlash 2 drafter, weights unchanged, with `max_position_embeddings`
raised in copies of their configs. Their RoPE is the default one, so positions
past 2,048 are extrapolated for both sides alike: absolute acceptance there is
lower than a long-context checkpoint's. The context is this checkout's own
Python source (dflash2_mlx/, sorted by path), cut to each length in tokens and
fed raw (no chat template), so every run of one commit reads the same ids; the
text changes with the source, so `context_ids(..., source=DIR)` reads another
commit's.
Not run on its own: imported by draft_window.py, prefill_policy.py, prefill_arm.py and
long_context.py beside it, and by benchmarks/adaptive/auto_injected.py and plain_step_instructions.py.
"""

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def long_rope_folders(folder: Path, max_positions: int) -> tuple[Path, Path]:
    """Write the look-alike into `folder`; return its (target, drafter) folders,
    which mlx-lm's `load` and this package's `load_pair` both read."""
    from dflash2_mlx.loading.builtin import resolve_builtin

    out = []
    for what in ("target", "drafter"):
        dest = Path(folder) / what
        shutil.copytree(resolve_builtin("builtin", what), dest)
        config = json.loads((dest / "config.json").read_text())
        config["max_position_embeddings"] = max_positions
        (dest / "config.json").write_text(json.dumps(config, indent=2))
        out.append(dest)
    return out[0], out[1]


def long_rope_pair(folder: Path, max_positions: int, **load):
    """The look-alike, loaded: (Pair, tokenizer). `load`: load_pair's keywords."""
    from dflash2_mlx import load_pair

    target, drafter = long_rope_folders(folder, max_positions)
    return load_pair(str(target), str(drafter), **load)


def context_ids(tokenizer, tokens: int, source=None) -> list[int]:
    """The first `tokens` ids of this checkout's Python source (dflash2_mlx/), or of the
    Python files under `source`, a folder (another commit's dflash2_mlx/, to read the same
    text on two commits: `git archive COMMIT dflash2_mlx | tar -x -C DIR`)."""
    folder = ROOT / "dflash2_mlx" if source is None else Path(source)
    text = "\n\n".join(p.read_text() for p in sorted(folder.rglob("*.py")))
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < tokens:
        raise SystemExit(f"error: the source text has {len(ids):,} tokens, fewer than the {tokens:,} asked for")
    return ids[:tokens]
