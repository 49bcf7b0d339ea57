"""`dflash2 train`: train a DFlash / DFlash 2 drafter for an mlx-lm target.

Data parallel over processes with MLX's own launcher: `--processes 2` runs
this command as two ring-backend ranks on this machine through `mlx.launch`
(see launch.py for why we do not leave the launcher at full priority). Across
several Macs, run it under `mlx.launch --hostfile ...` yourself.
"""

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash2_mlx.errors import DFlashError
from dflash2_mlx.train.trainer import TRAINABLE

from . import options as o
from . import ui


def train(
    data: Annotated[list[Path], typer.Option("--data", help="Text/JSONL files or folders (repeatable).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoints/ and the final drafter/.")],
    model: o.Model = "builtin",
    kind: Annotated[str, typer.Option("--kind", help="dflash2 or dflash.")] = "dflash2",
    trainable: Annotated[str, typer.Option("--train", help="What trains: " + "; ".join(
        f"{k} = {v}" for k, v in TRAINABLE.items()) + ".")] = "all",
    init_from: Annotated[Optional[str], typer.Option("--init-from", help="Start from this drafter (e.g. a DFlash v1 one to upgrade).")] = None,
    layers: Annotated[int, typer.Option("--layers", help="Drafter layers (new drafters).")] = 1,
    block_size: Annotated[int, typer.Option("--block-size", help="Block size (new drafters).")] = 16,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Training sequence length.")] = 256,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps in all (a resumed run continues to this many).")] = 1000,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per step, all processes together.")] = 8,
    blocks_per_seq: Annotated[int, typer.Option("--blocks-per-seq", help="Draft blocks sampled from each training sequence per step.")] = 8,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW; linear warm-up, then cosine decay).")] = 6e-4,
    selector_rank: Annotated[int, typer.Option("--selector-rank", help="Rank of the DFlash 2 selector's codebooks (new drafters).")] = 256,
    target_layers: Annotated[Optional[str], typer.Option("--target-layers", help=(
        "Target layers the drafter reads, comma-separated (new drafters; default: one per drafter layer, "
        "spread as the reference trainers do)."))] = None,
    feature_store: Annotated[Optional[Path], typer.Option("--feature-store", help=(
        "Folder that keeps the target's features of every training sequence after their first use, for "
        "later epochs, resumed runs and other drafters on the same data (float16; can be large)."))] = None,
    mask_token_id: Annotated[Optional[int], typer.Option("--mask-token-id", help=(
        "Token id the drafter's masked block positions read (new drafters; default: a spare embedding "
        "row, else a special token the model never writes)."))] = None,
    regenerate: Annotated[int, typer.Option("--regenerate", help="Complete each prompt with the target (this many tokens) first.")] = 0,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Held-out loss and recall every this many steps.")] = 100,
    patience: Annotated[int, typer.Option("--patience", help=(
        "Stop once the held-out loss has not improved (by 0.001) for this many evaluations in a row, and "
        "export the best evaluated drafter instead of the last (0: train every --steps step)."))] = 0,
    save_every: Annotated[int, typer.Option("--save-every", help="Write a checkpoint every this many steps (the last two are kept).")] = 100,
    processes: Annotated[int, typer.Option("--processes", min=1,
                                           help="Data-parallel ranks on this machine (mlx.launch, ring backend).")] = 1,
    seed: Annotated[int, typer.Option("--seed", help=(
        "Seed of the run: a new drafter's initial weights, the order of the training batches and where "
        "draft blocks are anchored in each sequence (resume with the same seed to continue the same batches)."))] = 0,
    debug: o.Debug = False,
):
    """Train a drafter; resumes from OUT/checkpoints when present."""
    from dflash2_mlx.train.outdir import check_out_dir
    from dflash2_mlx.train.setup import check_run_options, prepare
    from dflash2_mlx.train.trainer import EvalEvent, SavedEvent, StepEvent, StoppedEvent, TrainConfig

    # Every option and the output folder are checked before any rank starts or model loads.
    config = TrainConfig(trainable=trainable, steps=steps, batch_size=batch_size, blocks_per_seq=blocks_per_seq,
                         lr=lr, eval_every=eval_every, save_every=save_every, seed=seed, patience=patience)
    layer_ids = _layer_list(target_layers)
    check_run_options(kind, layers, block_size, seq_len, selector_rank, regenerate, layer_ids)
    check_out_dir(out.expanduser())
    if processes > 1 and "MLX_RANK" not in os.environ:  # not yet a rank: become N of them
        return _run_as_ranks(processes, out)
    import mlx.core as mx

    group = mx.distributed.init()
    trainer = prepare(model, [str(p) for p in data], out, kind=kind, num_layers=layers, block_size=block_size,
                      seq_len=seq_len, init_from=init_from, regenerate_tokens=regenerate,
                      selector_rank=selector_rank, target_layer_ids=layer_ids, mask_token_id=mask_token_id,
                      feature_store=str(feature_store) if feature_store else None, config=config, group=group if group.size() > 1 else None)
    lead = group.rank() == 0
    if trainer.resume() and lead:
        ui.status(trainer.resume_note)
    with ui.TrainProgress(steps, trainer.step, enabled=lead) as progress:
        for event in trainer.run():
            if not lead:
                continue
            if isinstance(event, StepEvent):
                progress.step(event)
            elif isinstance(event, EvalEvent):
                progress.note(ui.eval_line(event))
            elif isinstance(event, SavedEvent):
                progress.note(f"saved {event.path}")
            elif isinstance(event, StoppedEvent):
                progress.note(f"stopped at step {event.step}: the held-out loss last improved at step "
                              f"{event.best_step} ({event.best_loss:.3f}), {patience} evaluations ago or more; "
                              f"the drafter exported is that step's")


def _layer_list(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--target-layers '{text}' is not a comma-separated list of layer numbers, e.g. 1,15,28") from None


def _without_processes_flag(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            out.append(a)
    return out


def _run_as_ranks(processes: int, out: Path) -> None:
    from dflash2_mlx.errors import DFlashError

    from .ranks import run_ranks

    export = out / "drafter" / "model.safetensors"
    before = export.stat().st_mtime_ns if export.exists() else None
    status = run_ranks(processes, _without_processes_flag(sys.argv[1:]))
    # mlx.launch can exit 0 after a rank failed: a freshly written export is the proof.
    if status != 0 or not export.exists() or export.stat().st_mtime_ns == before:
        raise DFlashError(f"data-parallel training did not finish (launcher exit {status}): "
                          f"see the ranks' messages above; rerun the same command to resume")
