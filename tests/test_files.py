"""Result files are written whole: dflash2_mlx/files.py."""

import threading
from pathlib import Path

import pytest

from dflash2_mlx.files import atomic_write_text


def test_two_writers_of_one_file_each_write_it_whole(tmp_path):
    """Two servers calibrating at once write the same calibration file: neither may fail
    and the file must always be one writer's whole text."""
    path, errors = tmp_path / "calibration.json", []
    texts = {name: name * 20_000 for name in "ab"}

    def write(name):
        try:
            for _ in range(200):
                atomic_write_text(path, texts[name])
        except Exception as e:  # noqa: BLE001 (the failure is what the test reports)
            errors.append(e)

    threads = [threading.Thread(target=write, args=(n,)) for n in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_text() in texts.values()
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]  # no temporary left behind


def test_a_checkpoint_removal_cut_short_never_leaves_half_a_checkpoint(tmp_path, monkeypatch):
    # Training prunes old checkpoints; a SIGTERM inside that removal once left a step folder
    # without its state.json (tests/test_rough_edges.py saw it now and then). The removal is
    # cut here after its first file, as the signal would.
    import shutil

    from dflash2_mlx.train import export

    folder = tmp_path / "step-0000004"
    folder.mkdir()
    for name in ("drafter.safetensors", "optimizer.safetensors", "state.json"):
        (folder / name).write_text("x")
    real_rmtree, cuts = shutil.rmtree, []

    def cut_short(path, ignore_errors=False):
        if not cuts:
            cuts.append(path)
            (Path(path) / "state.json").unlink()
            raise KeyboardInterrupt
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(export.shutil, "rmtree", cut_short)
    with pytest.raises(KeyboardInterrupt):
        export.remove_folder(folder)
    steps = [p for p in tmp_path.iterdir() if p.name.startswith("step-")]
    assert all((p / "state.json").is_file() for p in steps), steps
    assert list(tmp_path.iterdir()) == []  # and the rest of it went too
