"""Result files are written whole: dflash2_mlx/files.py."""

import threading

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
