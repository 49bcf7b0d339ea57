"""`dflash2 analyze`: the seed's recall, τ and latency tables for our drafters."""

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash2_mlx.files import atomic_write_text

from . import inputs
from . import options as o
from . import plotting
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
    seq_len: Annotated[int, typer.Option("--seq-len", help=(
        "Tokens per held-out sequence: the held-out text is packed into sequences this long for the "
        "teacher-forced recall, and each decode prompt is cut from the start of one."))] = 256,
    heldout_fraction: Annotated[float, typer.Option("--heldout-fraction", help=(
        "Share of --data held out, picked the way `dflash2 train` picks its 0.05 (whole files or JSONL lines, "
        "by a hash of each name): keep 0.05 to measure on text the drafters did not train on, or 1 when "
        "none of --data was trained on."))] = 0.05,
    prompts: Annotated[int, typer.Option("--prompts", help="Held-out prompts to decode.")] = 16,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help=(
        "Tokens of each decode prompt, the start of a held-out sequence (at most --seq-len); "
        "--max-tokens more are decoded after it."))] = 64,
    max_tokens: o.MaxTokens = 64,
    block_size: o.BlockSize = None,
    tree: o.Tree = 0,
    plot: plotting.PlotDir = None,
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

    from dflash2_mlx.engine.plan import fit

    # The decode settings, checked as a request's (analyze measures fixed blocks: no auto).
    request = inputs.decode_request(max_tokens=max_tokens, temp=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                                    block_size=block_size, tree=tree)
    if request.auto:
        raise DFlashError("--block-size auto does not apply to analyze (it measures fixed blocks): give a size, "
                          "e.g. 8, or leave it out for each drafter's own")
    plotting.check_plot(plot, folder=True)
    if not 0 < heldout_fraction <= 1:
        raise DFlashError(f"--heldout-fraction {heldout_fraction:g} must be in (0, 1]: the share of examples held out "
                          "(1: every example, for data the drafters were not trained on)")
    refs = {"dflash": dflash, "dflash+selector": selector, "dflash+conv": conv, "dflash2": dflash2}
    refs = {k: v for k, v in refs.items() if v}
    if not refs:
        raise DFlashError("no drafters: pass at least one of --dflash, --selector, --conv, --dflash2")
    ui.progress_note(f"loading the target and {len(refs)} drafter(s)…")
    target, tokenizer = load_target(resolve_builtin(model, "target"), activation_dtype=mx.float32)
    pairs = {k: Pair.make(target, load_drafter(resolve_builtin(v, "drafter"), activation_dtype=mx.float32))
             for k, v in refs.items()}
    for pair in pairs.values():  # before any measurement: a bad value fails now, in one line
        fit(pair, request)
    _check_lengths(target, seq_len, prompt_len, max_tokens, prompts)
    ui.progress_note("reading the held-out share of --data…")
    heldout = heldout_sequences([str(p) for p in data], tokenizer, seq_len, heldout_fraction)
    # Minutes of work: a bar on a terminal, plain lines on stderr otherwise.
    with ui.AnalyzeProgress() as progress:
        result = run_analysis(pairs, heldout, prompt_len=prompt_len, n_prompts=prompts,
                              max_tokens=max_tokens, block_size=request.block_size, tree_rows=request.tree_rows,
                              on_step=progress)
    from dflash2_mlx.tools.provenance import provenance

    from .main import command_typed  # imported by now: it runs this command

    command = command_typed()
    result.update(provenance(command))
    atomic_write_text(out / "analysis.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "analysis.md", markdown(result, command))
    ui.status(f"wrote {out / 'analysis.json'} and {out / 'analysis.md'}")
    if plot is not None:
        from dflash2_mlx.tools.plots import analyze_plots

        analyze_plots(result, plot)
        ui.status(f"drew the plots into {plot}")


def _check_lengths(target, seq_len: int, prompt_len: int, max_tokens: int, prompts: int) -> None:
    """--seq-len and --prompt-len + --max-tokens within the target's context."""
    from dflash2_mlx.errors import DFlashError
    from dflash2_mlx.text.context import context_limit

    for flag, value in (("--seq-len", seq_len), ("--prompt-len", prompt_len), ("--max-tokens", max_tokens),
                        ("--prompts", prompts)):
        if value < 1:
            raise DFlashError(f"{flag} {value} must be at least 1")
    limit = context_limit(target)
    if limit is None:
        return
    if seq_len > limit:
        raise DFlashError(f"--seq-len {seq_len:,} is over this model's context of {limit:,} tokens: "
                          f"pass --seq-len {limit:,} or less")
    if min(prompt_len, seq_len) + max_tokens > limit:
        raise DFlashError(f"--prompt-len {prompt_len:,} and --max-tokens {max_tokens:,} are over this model's "
                          f"context of {limit:,} tokens: lower either so that they add up to {limit:,} or less")
