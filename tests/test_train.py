"""Drafter training: it learns, resumes exactly, splits across processes
exactly, trains only what is asked, exports a loadable released checkpoint,
and refuses bad input with one clear error."""

import json
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.errors import DFlashError
from dflash2_mlx.loading.load_pair import load_pair
from dflash2_mlx.train.setup import prepare
from dflash2_mlx.train.trainer import EvalEvent, StepEvent, StoppedEvent, TrainConfig, read_metrics
from helpers import ar_tokens, decode_steps, drafter_folder, target_folder

DATA = [str(Path(sysconfig.get_paths()["stdlib"]) / "json")]
SMALL = dict(kind="dflash2", num_layers=1, block_size=8, seq_len=64, selector_rank=32)
# The `dflash2` command without PATH: cli/__main__.py runs the console script's entry.
DFLASH2 = [sys.executable, "-m", "dflash2_mlx.cli"]


def trainer(out, steps=12, save_every=6, **kw):
    cfg = TrainConfig(steps=steps, batch_size=4, blocks_per_seq=4, save_every=save_every,
                      **{"lr": 3e-3, "eval_every": steps,
                         **{k: kw.pop(k) for k in list(kw) if k in ("trainable", "seed", "lr", "eval_every", "patience")}})
    return prepare(str(target_folder("qwen3")), DATA, out, config=cfg, **{**SMALL, **kw})


def run_until(t, stop_step=None):
    losses = []
    for ev in t.run():
        if isinstance(ev, StepEvent):
            losses.append(ev.loss)
            if ev.step == stop_step:
                break
    return losses


def params(model):
    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def test_training_lowers_heldout_loss(tmp_path):
    t = trainer(tmp_path / "run", steps=40, save_every=40)
    first = t.evaluate().loss
    events = list(t.run())
    last = [e for e in events if isinstance(e, EvalEvent)][-1]
    assert last.loss < first - 0.3, (first, last.loss)
    assert len(last.recall1_by_position) == 7


def test_patience_stops_when_heldout_loss_stalls_and_exports_the_best_evaluation(tmp_path):
    # A learning rate too small to move the held-out loss by MIN_IMPROVEMENT: the first evaluation
    # (step 2) stays the best, and two evaluations without improvement (steps 4, 6) stop the run.
    t = trainer(tmp_path / "run", steps=100, save_every=100, lr=1e-12, eval_every=2, patience=2)
    events = list(t.run())
    stops = [e for e in events if isinstance(e, StoppedEvent)]
    assert len(stops) == 1 and (stops[0].step, stops[0].best_step) == (6, 2), stops
    assert t.step == 6
    best = mx.load(str(tmp_path / "run" / "best" / "drafter.safetensors"))
    exported = mx.load(str(tmp_path / "run" / "drafter" / "model.safetensors"))
    assert json.loads((tmp_path / "run" / "best" / "state.json").read_text())["step"] == 2
    last = params(t.drafter)  # the weights of the run's end are the best's after the export
    assert all(np.array_equal(np.array(best[k]), last[k]) for k in best)
    assert any(k.endswith("weight") for k in exported)


def test_patience_continues_while_heldout_loss_improves(tmp_path):
    t = trainer(tmp_path / "run", steps=12, save_every=12, eval_every=4, patience=1)
    events = list(t.run())
    assert not [e for e in events if isinstance(e, StoppedEvent)] and t.step == 12


def test_resume_is_exact(tmp_path):
    straight = trainer(tmp_path / "a")
    run_until(straight)
    t1 = trainer(tmp_path / "b")
    run_until(t1, stop_step=8)  # checkpoint at 6, then "killed" during step 8
    t2 = trainer(tmp_path / "b")
    assert t2.resume() and t2.step == 6
    run_until(t2)
    a, b = params(straight.drafter), params(t2.drafter)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # The loss curve has one record per step: records of the redone steps 7-8 were dropped.
    def curve(folder):
        return [(r["step"], r["loss"]) for r in read_metrics(folder, "step")]
    assert curve(tmp_path / "b") == curve(tmp_path / "a") and len(curve(tmp_path / "a")) == 12


@pytest.mark.slow
def test_killed_process_resumes_from_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dflash2_mlx.cli", "train", "--model", str(target_folder("qwen3")),
           "--data", DATA[0], "--out", str(out), "--steps", "200", "--batch-size", "4", "--blocks-per-seq", "4",
           "--seq-len", "64", "--block-size", "8", "--selector-rank", "32", "--save-every", "2", "--eval-every", "1000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "checkpoints").glob("step-0000004")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t = trainer(out, steps=200, save_every=2)
    assert t.resume() and t.step >= 4
    # No half-written checkpoint is ever visible under its final name.
    for folder in (out / "checkpoints").glob("step-*"):
        assert {"drafter.safetensors", "optimizer.safetensors", "state.json"} <= {p.name for p in folder.iterdir()}


def test_two_processes_match_one(tmp_path):
    """Same global batch over two ring-backend ranks (`--processes 2`: mlx.launch on loopback)."""
    common = ["train", "--model", str(target_folder("qwen3")), "--data", DATA[0], "--steps", "4",
              "--batch-size", "4", "--blocks-per-seq", "4", "--seq-len", "64", "--block-size", "8",
              "--selector-rank", "32", "--save-every", "4", "--eval-every", "4"]
    one = subprocess.run([*DFLASH2, *common, "--out", str(tmp_path / "one")], capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([*DFLASH2, *common, "--processes", "2", "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    a = mx.load(str(tmp_path / "one" / "drafter" / "model.safetensors"))
    b = mx.load(str(tmp_path / "two" / "drafter" / "model.safetensors"))
    for k in a:
        assert np.allclose(np.array(a[k].astype(mx.float32)), np.array(b[k].astype(mx.float32)), atol=2e-2), k
    losses = [[r["loss"] for r in read_metrics(tmp_path / run, "step")] for run in ("one", "two")]
    assert len(losses[0]) == 4 and np.allclose(losses[0], losses[1], atol=1e-3), losses


def test_a_failing_rank_is_one_error(tmp_path):
    r = subprocess.run([*DFLASH2, "train", "--model", str(target_folder("qwen3")), "--data",
                        str(tmp_path / "missing.txt"), "--processes", "2", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "data-parallel training did not finish" in r.stderr.splitlines()[-1]


def test_selector_only_upgrade_of_a_v1_drafter(tmp_path):
    v1 = str(drafter_folder("qwen3", "dflash"))
    t = trainer(tmp_path / "run", steps=3, save_every=3, init_from=v1, trainable="selector")
    assert t.drafter.is_dflash2
    before = params(t.drafter)
    run_until(t)
    after = params(t.drafter)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert changed and all(k.startswith("candidate_selector.") for k in changed), changed


def test_export_is_a_released_checkpoint_with_parity(tmp_path):
    t = trainer(tmp_path / "run", steps=2, save_every=2)
    run_until(t)
    folder = tmp_path / "run" / "drafter"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["dflash_config"]["block_size"] == 8
    names = set(mx.load(str(folder / "model.safetensors")))
    assert "candidate_selector.predecessor_codebook" in names and "fc.weight" in names
    pair, _ = load_pair(str(target_folder("qwen3")), str(folder))
    target, drafter = pair.target, pair.drafter
    from dflash2_mlx.engine.request import DecodeRequest

    request = DecodeRequest(max_tokens=30, block_size=None)
    out = [x for s in decode_steps([5, 6, 7], Pair.make(target, drafter), request) for x in s.tokens]
    assert out == ar_tokens(target, [5, 6, 7], 30)


@pytest.mark.parametrize("case", ["empty", "foreign-drafter", "block-vs-seq", "unwritable", "corrupt"])
def test_bad_input_is_one_clear_error(tmp_path, case):
    if case == "empty":
        (tmp_path / "empty.txt").write_text("   \n")
        with pytest.raises(DFlashError, match="empty"):
            prepare(str(target_folder("qwen3")), [str(tmp_path / "empty.txt")], tmp_path / "o", **SMALL)
    elif case == "foreign-drafter":
        from dflash2_mlx.tools.synthetic import drafter_config_dict, write_drafter, target_config

        other = target_config("qwen3", hidden_size=32)
        write_drafter(tmp_path / "foreign", drafter_config_dict(other, "dflash"))
        with pytest.raises(DFlashError, match="hidden_size"):
            trainer(tmp_path / "o", init_from=str(tmp_path / "foreign"))
    elif case == "block-vs-seq":
        with pytest.raises(DFlashError, match="seq-len"):
            prepare(str(target_folder("qwen3")), DATA, tmp_path / "o", **{**SMALL, "block_size": 64})
    elif case == "unwritable":
        (tmp_path / "file").write_text("x")
        with pytest.raises(DFlashError, match="cannot write"):
            trainer(tmp_path / "file" / "run")
    else:
        t = trainer(tmp_path / "o", steps=2, save_every=2)
        run_until(t)
        ckpt = sorted((tmp_path / "o" / "checkpoints").glob("step-*"))[-1]
        data = (ckpt / "optimizer.safetensors").read_bytes()
        (ckpt / "optimizer.safetensors").write_bytes(data[: len(data) // 2])
        with pytest.raises(DFlashError, match="corrupt"):
            trainer(tmp_path / "o", steps=2).resume()


@pytest.mark.parametrize("which,frozen", [("no-selector", "candidate_selector."), ("no-conv", "_conv.")])
def test_ablation_runs_keep_their_part_at_identity(tmp_path, which, frozen):
    t = trainer(tmp_path / "run", steps=3, save_every=3, trainable=which)
    before = params(t.drafter)
    run_until(t)
    after = params(t.drafter)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert changed and not any(frozen in k for k in changed), sorted(changed)[:5]


def test_init_from_keeps_the_source_config(tmp_path):
    """A DFlash 2 drafter with sliding layers and rank 32 trains and exports as itself."""
    src = drafter_folder("qwen3", "dflash2", sliding=True)
    t = trainer(tmp_path / "run", steps=2, save_every=2, init_from=str(src))
    run_until(t)
    exported = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
    original = json.loads((src / "config.json").read_text())
    assert exported["layer_types"] == original["layer_types"] and exported["sliding_window"] == 8
    assert exported["dflash_config"]["selector_rank"] == original["dflash_config"]["selector_rank"]
    load_pair(str(target_folder("qwen3")), str(tmp_path / "run" / "drafter"))
