"""The target split over two MLX ring ranks on loopback gives the one-process
output, and a rank that dies ends the run everywhere with one line.

These start real ranks through `mlx.launch` (two processes on this 2-core
machine), so they are few: one sharded run per target family carries all its
decode cases (DFlash and DFlash 2 drafters, block sizes spread over 2..16
between the two families, T=0 and T=1 with one seed).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import drafter_folder, target_folder

HERE = Path(__file__).parent
PYTHON = sys.executable
LAUNCH = str(Path(sys.executable).with_name("mlx.launch"))

# Block sizes spread over 2..16 across the two families; T=1 on some of each.
CASES = {
    "qwen3": [("dflash2", 2, 0.0), ("dflash2", 7, 0.0), ("dflash2", 16, 1.0),
              ("dflash", 4, 0.0), ("dflash", 11, 1.0)],
    "llama": [("dflash2", 3, 0.0), ("dflash2", 9, 1.0), ("dflash2", 14, 0.0),
              ("dflash", 5, 1.0), ("dflash", 16, 0.0)],
}
MAX_TOKENS = 24


def _spec(family: str) -> dict:
    return {
        "target": str(target_folder(family)),
        "drafters": {kind: str(drafter_folder(family, kind)) for kind in ("dflash", "dflash2")},
        "cases": [{"kind": k, "B": B, "temp": T, "seed": 7} for k, B, T in CASES[family]],
        "max_tokens": MAX_TOKENS,
    }


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_two_ranks_match_one_process(family, tmp_path):
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target

    from distributed_cases import case_key, run_cases

    spec = _spec(family)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [LAUNCH, "-n", "2", "--backend", "ring", PYTHON, str(HERE / "distributed_driver.py"),
         str(tmp_path / "spec.json"), str(tmp_path)],
        stdin=subprocess.PIPE, capture_output=True, text=True, timeout=240, env=_env(),
    )
    ranks = [tmp_path / f"rank-{r}.json" for r in (0, 1)]
    assert all(p.exists() for p in ranks), run.stderr[-2000:]
    r0, r1 = (json.loads(p.read_text()) for p in ranks)

    # The one-process reference, in this process.
    target, _ = load_target(spec["target"])
    drafters = {k: load_drafter(p) for k, p in spec["drafters"].items()}
    one = run_cases(target, drafters, spec["cases"], MAX_TOKENS)

    assert r0["ranks"] == 2
    # Two sharded-to-all projections per layer, all inside the layers.
    assert r0["collectives_per_pass"] == 2 * target.num_layers
    # Every rank holds the same whole logits and captured features, bitwise...
    assert r0["digest"] == r1["digest"]
    # ...equal to one process up to fp32 rounding (the all_sum adds two partial matmuls).
    np.testing.assert_allclose(r0["logits"], one["logits"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(r0["features"], one["features"], rtol=1e-4, atol=1e-4)
    for case in spec["cases"] + [None]:
        key = "ar" if case is None else case_key(case)
        assert r0["tokens"][key] == r1["tokens"][key], key
        assert r0["tokens"][key] == one["tokens"][key], key
        assert len(one["tokens"][key]) == MAX_TOKENS
