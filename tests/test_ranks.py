"""`dflash2 train --processes N`: the relaunch argv and the launcher's priority
(the 2x itself is measured by benchmarks/training/train_dp.py)."""

import os
import subprocess
import sys

import pytest

from dflash2_mlx.cli.ranks import _children, _deprioritize
from dflash2_mlx.cli.train import _without_processes_flag


def test_processes_flag_is_removed_in_every_spelling():
    argv = ["train", "--processes", "2", "--data", "x", "--processes=3", "--out", "o"]
    assert _without_processes_flag(argv) == ["train", "--data", "x", "--out", "o"]


def test_deprioritize_lowers_every_thread_of_the_process_not_its_children():
    if os.getpriority(os.PRIO_PROCESS, 0) >= 19:
        pytest.skip("this test process already runs at the lowest priority")
    code = ("import subprocess, threading, time, sys; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            kids = _children(parent.pid)
            if kids:
                break
            subprocess.run(["sleep", "0.1"])
        assert kids, "the child process never started"
        _deprioritize(parent.pid)
        assert os.getpriority(os.PRIO_PROCESS, parent.pid) == 19
        tasks = f"/proc/{parent.pid}/task"
        if os.path.isdir(tasks):  # Linux: every thread
            assert all(os.getpriority(os.PRIO_PROCESS, int(t)) == 19 for t in os.listdir(tasks))
        assert os.getpriority(os.PRIO_PROCESS, kids[0]) == os.getpriority(os.PRIO_PROCESS, os.getpid())
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)])
        parent.kill()
        parent.wait()
