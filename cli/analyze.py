"""`dflash2 analyze`: the seed's recall, τ and latency tables for our drafters."""

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash2_mlx.files import atomic_write_text

from . import options as o
from . import ui

DFlashRef = Annotated[Optional[str], typer.Option("--dflash", help="The DFlash baseline drafter.")]
SelectorRef = Annotated[Optional[str], typer.Option("--selector", help="The DFlash + selector drafter.")]
ConvRef = Annotated[Optional[str], typer.Option("--conv", help="The DFlash + conv drafter.")]
DFlash2Ref = Annotated[Optional[str], typer.Option("--dflash2", help="The DFlash 2 drafter.")]


def analyze(
    data: Annotated[list[Path], typer.Option("--data", help="Text/JSONL files or folders; the held-out split is used.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for analysis.json and analysis.md.")],
    model: o.Model = "builtin",
    dflash: DFlashRef = None,
    selector: SelectorRef = None,
    conv: ConvRef = None,
    dflash2: DFlash2Ref = None,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 256,
    heldout_fraction: Annotated[float, typer.Option("--heldout-fraction")] = 0.05,
    prompts: Annotated[int, typer.Option("--prompts", help="Held-out prompts to decode.")] = 16,
    prompt_len: Annotated[int, typer.Option("--prompt-len")] = 64,
    max_tokens: o.MaxTokens = 64,
    block_size: o.BlockSize = None,
    tree: o.Tree = 0,
    debug: o.Debug = False,
):
    """Recall by position, oracle τ, decoded τ at T=0/T=1 (and with --tree N beside the chain),
    parameters and cycle latency per variant."""
    import mlx.core as mx

    from dflash2_mlx.tools.analyze import analyze as run_analysis
    from dflash2_mlx.tools.analyze import heldout_sequences
    from dflash2_mlx.tools.analyze import markdown
    from dflash2_mlx.errors import DFlashError
    from dflash2_mlx.engine.pair import Pair
    from dflash2_mlx.loading.builtin import resolve_builtin
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target

    o.check_tree(tree)
    refs = {"dflash": dflash, "dflash+selector": selector, "dflash+conv": conv, "dflash2": dflash2}
    refs = {k: v for k, v in refs.items() if v}
    if not refs:
        raise DFlashError("no drafters: pass at least one of --dflash, --selector, --conv, --dflash2")
    target, tokenizer = load_target(resolve_builtin(model, "target"), activation_dtype=mx.float32)
    pairs = {k: Pair.make(target, load_drafter(resolve_builtin(v, "drafter"), activation_dtype=mx.float32))
             for k, v in refs.items()}
    heldout = heldout_sequences([str(p) for p in data], tokenizer, seq_len, heldout_fraction)
    result = run_analysis(pairs, heldout, prompt_len=prompt_len, n_prompts=prompts,
                          max_tokens=max_tokens, block_size=block_size, tree_rows=tree)
    from dflash2_mlx.tools.provenance import command_line, provenance

    command = command_line("dflash2", sys.argv[1:])
    result.update(provenance(command))
    atomic_write_text(out / "analysis.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "analysis.md", markdown(result, command))
    ui.status(f"wrote {out / 'analysis.json'} and {out / 'analysis.md'}")
