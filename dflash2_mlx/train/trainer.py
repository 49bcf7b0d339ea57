"""The drafter training loop: online target features, packed blocks, AdamW.

`train` is a generator of progress events (the CLI renders them); it writes
atomic checkpoints and resumes exactly: the data order and every anchor are
functions of (seed, step, rank), so a resumed run sees the same batches.
Data parallelism uses MLX's own distributed backend (`mlx.launch`): each rank
takes its slice of every global batch and gradients are averaged.
"""

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..engine.pair import Pair
from ..errors import DFlashError
from ..files import atomic_write_text
from .data import BatchOrder
from .export import atomic_write_folder, export_drafter, remove_folder
from .outdir import BEST, BEST_STATE, BEST_WEIGHTS, CHECKPOINT_FORMAT, check_export_target, own_checkpoints
from .loss import block_loss, recall_by_position, selector_loss
from .forward import packed_forward, target_features
from .packing import make_blocks, sample_anchors
from .plateau import Plateau


@dataclass(frozen=True)
class TrainConfig:
    trainable: str = "all"  # "all", "dflash2" (conv + selector) or "selector"
    steps: int = 1000
    batch_size: int = 8  # sequences per step, over all ranks
    blocks_per_seq: int = 8
    lr: float = 6e-4
    warmup: float = 0.04
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    selector_loss_weight: float = 1.0
    eval_every: int = 100
    save_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    # Stop once the held-out loss has not improved for this many evaluations in a row (0: run
    # every step); the exported drafter is then the best evaluated one, not the last.
    patience: int = 0

    def __post_init__(self):
        # Refused here, before any folder is made or model loaded: a zero would
        # otherwise divide, loop forever or train nothing after minutes of loading.
        for flag, value in (("--steps", self.steps), ("--batch-size", self.batch_size),
                            ("--blocks-per-seq", self.blocks_per_seq), ("--eval-every", self.eval_every),
                            ("--save-every", self.save_every)):
            if value < 1:
                raise DFlashError(f"{flag} {value} must be at least 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise DFlashError(f"--lr {self.lr} must be a positive number")
        if not 0 <= self.seed < 2**64:
            raise DFlashError(f"--seed {self.seed} must be between 0 and 2**64 - 1")
        if self.patience < 0:
            raise DFlashError(f"--patience {self.patience} must be 0 (off) or more")
        if self.keep_checkpoints < 1:
            raise DFlashError(f"keep_checkpoints {self.keep_checkpoints} must be at least 1")


@dataclass(frozen=True)
class StepEvent:
    step: int
    loss: float
    selector_loss: float
    lr: float
    tokens_per_s: float
    recall1: float  # teacher-forced top-1 hit rate over all draft rows of this batch


@dataclass(frozen=True)
class EvalEvent:
    step: int
    loss: float
    recall1_by_position: list
    recallK_by_position: list


@dataclass(frozen=True)
class SavedEvent:
    step: int
    path: str


@dataclass(frozen=True)
class StoppedEvent:
    """Training stopped early: the held-out loss last improved at `best_step`."""

    step: int
    best_step: int
    best_loss: float


Event = Union[StepEvent, EvalEvent, SavedEvent, StoppedEvent]


TRAINABLE = {
    "all": "everything",
    "dflash2": "the conv and the selector only (backbone frozen)",
    "selector": "the selector only (e.g. upgrading a DFlash v1 drafter)",
    "no-selector": "backbone + conv; the selector stays at identity (the 'DFlash + conv' ablation)",
    "no-conv": "backbone + selector; the conv stays at identity (the 'DFlash + selector' ablation)",
}


def select_trainable(drafter, which: str) -> None:
    """Freeze everything the run should not train."""
    if which not in TRAINABLE:
        raise DFlashError(f"--train '{which}' is not one of {', '.join(TRAINABLE)}")
    if which != "all" and not drafter.is_dflash2:
        raise DFlashError(f"--train {which} needs a DFlash 2 drafter (it trains the DFlash 2 parts)")
    drafter.unfreeze()
    if which == "all":
        return
    convs = [conv for layer in drafter.layers for conv in (layer.attention_conv, layer.mlp_conv)]
    if which in ("dflash2", "selector"):
        drafter.freeze()
        drafter.candidate_selector.unfreeze()
        if which == "dflash2":
            for conv in convs:
                conv.unfreeze()
    elif which == "no-selector":
        drafter.candidate_selector.freeze()
    else:
        for conv in convs:
            conv.freeze()


def trains_selector(which: str) -> bool:
    return which != "no-selector"


METRICS = "metrics.jsonl"


def read_metrics(out_dir, kind: Optional[str] = None) -> list[dict]:
    """The records a run logged ("step" and "eval"; `kind` keeps one of them).
    A torn last line from a killed run is skipped."""
    path = Path(out_dir) / METRICS
    records = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record and kind in (None, record.get("kind")):
            records.append(record)
    return records


class DrafterTrainer:
    def __init__(self, target, drafter, drafter_config: dict, sequences: np.ndarray,
                 heldout: np.ndarray, config: TrainConfig, out_dir, group=None, answers=(None, None)):
        self.target, self.drafter, self.drafter_config = target, drafter, drafter_config
        # Layer ids and the selector's logit transform, resolved once.
        self.pair = Pair.make(target, drafter)
        self.sequences, self.heldout, self.config = sequences, heldout, config
        self.out_dir = Path(out_dir)
        self.group = group
        self.rank = group.rank() if group else 0
        self.world = group.size() if group else 1
        if config.batch_size % self.world:
            raise DFlashError(f"--batch-size {config.batch_size} must be a multiple of the {self.world} processes")
        B = drafter.config.block_size
        if sequences.shape[1] <= B:
            raise DFlashError(
                f"block size {B} does not fit sequences of {sequences.shape[1]} tokens: raise --seq-len above {B}"
            )
        self.mask_id = drafter.config.mask_token_id
        select_trainable(drafter, config.trainable)
        warm = max(1, int(config.warmup * config.steps))
        schedule = optim.join_schedules(
            [optim.linear_schedule(0.0, config.lr, warm), optim.cosine_decay(config.lr, max(1, config.steps - warm))],
            [warm],
        )
        self.optimizer = optim.AdamW(learning_rate=schedule, betas=[0.9, 0.95], weight_decay=config.weight_decay)
        self.stores = {}  # sequences (by identity) -> FeatureStore
        self.answers = {id(sequences): answers[0], id(heldout): answers[1]}  # where blocks lie (None: anywhere)
        self.step = 0
        self.resume_note = ""  # what resuming did, for the user (set by `resume`)
        self.plateau = Plateau()  # this run's evaluations, for --patience
        self._grad_fn = nn.value_and_grad(drafter, self._loss)

    # -- the model pass ---------------------------------------------------------
    def _forward(self, drafter, feats, inputs, seq, anchors):
        return packed_forward(self.target, drafter, feats, inputs, seq, anchors)

    def _loss(self, drafter, feats, inputs, labels, seq, anchors):
        hidden, logits = self._forward(drafter, feats, inputs, seq, anchors)
        loss = block_loss(logits, labels)
        sel = mx.array(0.0)
        # A frozen selector must not pull the backbone through its loss.
        if drafter.is_dflash2 and trains_selector(self.config.trainable):
            sel, _ = selector_loss(drafter, logits, hidden, inputs, labels, self.pair.selector_transform)
        recall = mx.mean((mx.argmax(logits, axis=-1) == labels).astype(mx.float32))
        return loss + self.config.selector_loss_weight * sel, (loss, sel, recall)

    def use_feature_stores(self, train, heldout) -> None:
        """Read the target's features from these stores (train/feature_store.py), not a new forward."""
        self.stores = {id(self.sequences): train, id(self.heldout): heldout}

    def _batch(self, rows: np.ndarray, keys: list, source: np.ndarray):
        B = self.drafter.config.block_size
        tokens = mx.array(source[rows])
        inside = self.answers.get(id(source))
        seq, anchors = sample_anchors(keys, tokens.shape[1], B, self.config.blocks_per_seq, None if inside is None else inside[rows])
        seq, anchors = mx.array(seq), mx.array(anchors)
        inputs, labels = make_blocks(tokens, seq, anchors, B, self.mask_id)
        store = self.stores.get(id(source))
        feats = store.features(rows) if store else target_features(self.target, tokens, self.pair.layer_ids)
        return feats, inputs, labels, seq, anchors

    # -- steps ----------------------------------------------------------------------
    def _global_rows(self, step: int) -> np.ndarray:
        """The global batch of `step`: a pure function of (seed, step)."""
        n, bs = len(self.sequences), self.config.batch_size
        consumed = step * bs
        return BatchOrder(n, self.config.seed, consumed // n, consumed % n).next(bs)

    def train_step(self) -> StepEvent:
        tic = time.perf_counter()
        positions = np.arange(self.config.batch_size)[self.rank :: self.world]
        rows = self._global_rows(self.step)[positions]
        keys = [[self.config.seed, self.step, int(p)] for p in positions]
        batch = self._batch(rows, keys, self.sequences)
        (_, (loss, sel, recall)), grads = self._grad_fn(self.drafter, *batch)
        if self.world > 1:
            grads = nn.average_gradients(grads, group=self.group)
            loss, sel, recall = (mx.distributed.all_sum(x, group=self.group) / self.world for x in (loss, sel, recall))
        grads, _ = optim.clip_grad_norm(grads, self.config.grad_clip)
        self.optimizer.update(self.drafter, grads)
        lr = self.optimizer.learning_rate  # the scheduled rate this update used
        mx.eval(self.drafter.parameters(), self.optimizer.state, loss, sel, recall)
        self.step += 1
        seconds = time.perf_counter() - tic
        tokens = self.config.batch_size * self.sequences.shape[1]
        return StepEvent(self.step, loss.item(), sel.item(), float(lr), tokens / seconds, recall.item())

    def evaluate(self, max_seqs: int = 64) -> EvalEvent:
        """Held-out loss and conditional Recall@1/@K by position (fixed anchors)."""
        rows = np.arange(min(max_seqs, len(self.heldout)))
        total, n = 0.0, 0
        counts = np.zeros((4, self.drafter.config.block_size - 1))  # hits@1, reached@1, hits@K, reached@K
        for start in range(0, len(rows), 8):
            chunk = rows[start : start + 8]
            keys = [[self.config.seed, 2**31 - 1, int(r)] for r in chunk]  # fixed eval anchors
            feats, inputs, labels, seq, anchors = self._batch(chunk, keys, self.heldout)
            hidden, logits = self._forward(self.drafter, feats, inputs, seq, anchors)
            h1, r1, hK, rK = recall_by_position(logits, labels, self.drafter.config.selector_top_k)
            total += block_loss(logits, labels).item() * inputs.shape[0]
            n += inputs.shape[0]
            counts += np.array(mx.stack([h1, r1, hK, rK]))
        recall1 = counts[0] / np.maximum(counts[1], 1)
        recallK = counts[2] / np.maximum(counts[3], 1)
        return EvalEvent(self.step, total / max(n, 1), recall1.tolist(), recallK.tolist())

    # -- checkpoints --------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    def save(self) -> Optional[Path]:
        """Atomic training checkpoint (rank 0 writes; all ranks hold the same state)."""
        if self.rank != 0:
            return None
        folder = self.ckpt_dir / f"step-{self.step:07d}"
        state = {"format": CHECKPOINT_FORMAT, "step": self.step, "config": asdict(self.config),
                 "drafter_config": self.drafter_config}
        atomic_write_folder(folder, {
            "drafter.safetensors": dict(tree_flatten(self.drafter.parameters())),
            "optimizer.safetensors": dict(tree_flatten(self.optimizer.state)),
            "state.json": state,
        })
        atomic_write_folder(self.ckpt_dir / "latest", {"pointer.json": {"folder": folder.name}})
        # Only checkpoints this tool wrote, oldest by step first; never the one just written.
        for _, old in own_checkpoints(self.ckpt_dir)[: -self.config.keep_checkpoints]:
            if old != folder:
                remove_folder(old)  # never a step folder without its state.json
        return folder

    def resume(self) -> bool:
        """Continue from the latest checkpoint in the output folder, if any."""
        pointer = self.ckpt_dir / "latest" / "pointer.json"
        if not pointer.exists():
            return False
        try:
            folder = self.ckpt_dir / json.loads(pointer.read_text())["folder"]
            state = json.loads((folder / "state.json").read_text())
            params = mx.load(str(folder / "drafter.safetensors"))
            opt_state = mx.load(str(folder / "optimizer.safetensors"))
        except Exception as e:
            raise DFlashError(
                f"the checkpoint in '{self.ckpt_dir}' is corrupt or incomplete ({type(e).__name__}): "
                "delete that folder to start over"
            ) from None
        if state["drafter_config"] != self.drafter_config:
            raise DFlashError(f"the checkpoint in '{self.ckpt_dir}' is for a different drafter: use another --out")
        self.drafter.load_weights(list(params.items()), strict=True)
        self.optimizer.state = tree_unflatten(list(opt_state.items()))
        self.step = state["step"]
        mx.eval(self.drafter.parameters(), self.optimizer.state)
        self._forget_metrics_after(self.step)
        self.resume_note = resume_note(self.step, (state.get("config") or {}).get("steps"), self.config.steps)
        return True

    def _forget_metrics_after(self, step: int) -> None:
        """Records past the checkpoint are about to be redone: drop them so the
        curve has one record per step."""
        if self.rank != 0 or not (self.out_dir / METRICS).exists():
            return
        kept = [r for r in read_metrics(self.out_dir) if r["step"] <= step]
        atomic_write_text(self.out_dir / METRICS, "".join(json.dumps(r) + "\n" for r in kept))

    def export(self, folder=None) -> Path:
        folder = Path(folder or self.out_dir / "drafter")
        check_export_target(folder)  # replaced whole: only ever an earlier export
        best = self._best_weights() if self.config.patience else None
        if best is not None:  # the best evaluated weights, not the last
            self.drafter.load_weights(list(mx.load(str(best)).items()), strict=True)
        return export_drafter(self.drafter, self.drafter_config, folder)

    # -- stopping by held-out loss (plateau.py) ----------------------------------------------
    def _keep_if_best(self, event: EvalEvent) -> None:
        """Rank 0 keeps the weights of the best evaluation so far (atomically) for the export."""
        self.plateau.add(event.step, event.loss)
        if self.rank == 0 and self.plateau.state()[0] == event.step:
            atomic_write_folder(self.out_dir / BEST, {
                BEST_WEIGHTS: dict(tree_flatten(self.drafter.parameters())),
                BEST_STATE: {"step": event.step, "loss": event.loss}})

    def _best_weights(self) -> Optional[Path]:
        """The kept best weights, when they are those of the best evaluation of this run's record."""
        try:
            kept = json.loads((self.out_dir / BEST / BEST_STATE).read_text())["step"]
        except (OSError, ValueError, KeyError):
            return None
        return self.out_dir / BEST / BEST_WEIGHTS if kept == self.plateau.state()[0] else None

    def log(self, event: Event) -> None:
        """Append a step or eval record to OUT/metrics.jsonl (rank 0): the loss
        curve for plots and the training benchmark. One write per line, so a
        killed run leaves whole lines; a resumed run appends after them."""
        if self.rank != 0 or isinstance(event, SavedEvent):
            return
        record = {"kind": "step" if isinstance(event, StepEvent) else "eval", **asdict(event)}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def run(self) -> Iterator[Event]:
        c = self.config
        # Every rank reads the record up to its (resumed) step before the first step, so the
        # ranks agree on when to stop; later evaluations are added as they happen.
        self.plateau = Plateau([(r["step"], r["loss"]) for r in read_metrics(self.out_dir, "eval") if r["step"] <= self.step])
        while self.step < c.steps:
            event = self.train_step()
            self.log(event)
            yield event
            stop = None
            if self.step % c.eval_every == 0 or self.step == c.steps:
                event = self.evaluate()
                self.log(event)
                yield event
                if c.patience:
                    self._keep_if_best(event)
                    best_step, best_loss, since = self.plateau.state()
                    if since >= c.patience:
                        stop = StoppedEvent(self.step, best_step, best_loss)
            if stop is not None or self.step % c.save_every == 0 or self.step == c.steps:
                path = self.save()
                if path is not None:
                    yield SavedEvent(self.step, str(path))
            if stop is not None:
                yield stop
                break
        if self.rank == 0:
            yield SavedEvent(self.step, str(self.export()))


def resume_note(step: int, planned: Optional[int], steps: int) -> str:
    """What resuming at `step` does when the run was started with another --steps."""
    if planned is None or planned == steps:
        return f"resumed from step {step}"
    if step >= steps:
        return (f"resumed at step {step}, already at or past --steps {steps} (the run was started with --steps "
                f"{planned}): nothing to train, the drafter is exported as it is at step {step}")
    return (f"resumed at step {step} of a run started with --steps {planned}: it now trains to --steps {steps}, "
            f"and the learning-rate schedule (warm-up and cosine decay) is recomputed for {steps} steps from here on")

