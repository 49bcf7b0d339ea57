"""Shared fixtures: the released checkpoint layouts and tiny look-alikes of them.

`tests/fixtures/<name>/` holds a real drafter's config.json and its safetensors
header (every tensor name, dtype and shape, no weights). The tiny checkpoints
below keep every key and the nesting of those configs and change only the
sizes, so they load through exactly the code path a Hub download takes.
"""

import copy
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

FIXTURES_DIR = Path(__file__).parent / "fixtures"
USER_CACHE_VAR = "DFLASH2_TESTS_USER_CACHE"
RELEASED = {"dflash": "zlab-dflash-qwen3-4b-b16", "dflash2": "zlab-dflash2-muse-glimmer"}

# The tiny target every drafter below is sized for (qwen3, mlx-lm layout).
TINY_TARGET = dict(hidden_size=64, num_hidden_layers=8, vocab_size=384)


def released_config(kind: str) -> dict:
    return json.loads((FIXTURES_DIR / RELEASED[kind] / "config.json").read_text())


def released_header(kind: str) -> dict:
    """Tensor name -> {"dtype", "shape", ...} as in the released safetensors header."""
    header = json.loads((FIXTURES_DIR / RELEASED[kind] / "safetensors-header.json").read_text())
    header.pop("__metadata__", None)
    return header


def scaled_released_config(kind: str, target_cfg: dict, nested: dict | None = None, **top) -> dict:
    """The released config.json for `kind` with only its sizes scaled to `target_cfg`.

    Every other key (and where it sits: top level or `dflash_config`) is kept.
    `nested` overrides `dflash_config` entries, `top` top-level ones.
    """
    from dflash2_mlx.engine.drafter.config import default_target_layer_ids

    cfg = copy.deepcopy(released_config(kind))
    H, n_target, V = target_cfg["hidden_size"], target_cfg["num_hidden_layers"], target_cfg["vocab_size"]
    cfg.update(hidden_size=H, intermediate_size=2 * H, num_attention_heads=4, num_key_value_heads=2,
               head_dim=H // 4, vocab_size=V, num_target_layers=n_target)
    dc = cfg["dflash_config"]
    dc["target_layer_ids"] = default_target_layer_ids(n_target, cfg["num_hidden_layers"])
    dc["mask_token_id"] = V - 1  # an embedding row past the tokenizer, like Qwen3's 151669
    if kind == "dflash2":
        dc["selector_rank"] = 32
    dc.update(nested or {})
    cfg.update(top)
    return cfg


def hash_tree(folder: Path) -> dict:
    """Relative path -> sha256 of every file under `folder`."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(folder).rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """A random 8-layer qwen3 target with tokenizer, written as mlx-lm writes it."""
    from dflash2_mlx.tools.synthetic import write_target

    return write_target(tmp_path_factory.mktemp("tiny-target") / "target", "qwen3", **TINY_TARGET)


@pytest.fixture(scope="session")
def tiny_target_config(tiny_target_dir) -> dict:
    return json.loads((tiny_target_dir / "config.json").read_text())


@pytest.fixture(scope="session")
def scaled_config(tiny_target_config):
    """`scaled_config(kind, nested=None, **top)`: a released config sized for the tiny target."""

    def make(kind: str, nested: dict | None = None, **top) -> dict:
        return scaled_released_config(kind, tiny_target_config, nested, **top)

    return make


@pytest.fixture(scope="session")
def drafter_ckpt(tmp_path_factory, scaled_config):
    """`drafter_ckpt(kind, codebook_suffix=False, seed=0, config=None)`: a tiny drafter
    checkpoint folder with the released key names (written once per argument set;
    copy it before changing it)."""
    from dflash2_mlx.tools.synthetic import write_drafter

    root = tmp_path_factory.mktemp("drafters")
    made: dict = {}

    def make(kind: str = "dflash2", codebook_suffix: bool = False, seed: int = 0,
             config: dict | None = None) -> Path:
        cfg = config if config is not None else scaled_config(kind)
        key = (kind, codebook_suffix, seed, json.dumps(cfg, sort_keys=True))
        if key not in made:
            made[key] = write_drafter(root / f"d{len(made)}-{kind}", cfg, seed=seed,
                                      codebook_suffix=codebook_suffix)
        return made[key]

    return make


@pytest.fixture
def copy_ckpt(tmp_path):
    """`copy_ckpt(folder)`: a private copy of a checkpoint folder, safe to break."""

    def make(folder: Path, name: str = "copy") -> Path:
        return Path(shutil.copytree(folder, tmp_path / name))

    return make


# The user's own cache folder (cli/user_cache.py), as it was before the run's private one
# replaced it: real models already fetched there (SmolLM2) are read from it, never written.
USER_CACHE = Path(os.environ.get(USER_CACHE_VAR) or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def pytest_configure(config):
    """CLI commands and servers keep calibrations and exactness verdicts in the user's cache
    folder: in tests, one private folder for the whole run, set before any fixture (a module's
    server too) and any xdist worker, which inherit it with every process they start. A
    calibration is then made once per run, not once per worker, and none reaches the user's."""
    if USER_CACHE_VAR in os.environ:  # a worker: its controller made the folder
        return
    os.environ[USER_CACHE_VAR] = str(USER_CACHE)
    os.environ["XDG_CACHE_HOME"] = config._run_cache = tempfile.mkdtemp(prefix="dflash2-tests-cache-")


def pytest_unconfigure(config):
    if getattr(config, "_run_cache", None):
        shutil.rmtree(config._run_cache, ignore_errors=True)


@pytest.fixture
def cli(capsys, monkeypatch):
    """cli(argv, stdin=None) -> (exit code, stdout, stderr): `dflash2` run in-process
    through its real entry point and error boundary."""
    import io
    import sys

    from dflash2_mlx.cli.main import main

    def call(argv, stdin=None):
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin if stdin is not None else ""))
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return e.value.code, out, err

    return call


def pytest_terminal_summary(terminalreporter):
    """One line when the browser tests were skipped: without it a local run says nothing
    about them unless asked with -rs (CI never skips them: tests/test_web_page.py)."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and "browser test:" in str(r.longrepr[2])]
    if skipped:
        reason = str(skipped[0].longrepr[2]).split("browser test: ", 1)[1]
        terminalreporter.write_line(f"{len(skipped)} browser tests skipped: {reason}", yellow=True)


# The files that take longest (a worker's wall seconds in the quiet 3-worker run of 2026-12-08, 120 s
# down to 40 s), handed out first: xdist hands out whole files (--dist loadfile) in collection
# order, and a long file handed out last keeps one worker busy after the others have finished
# (workers ended 34 s apart in that run). A stale list costs nothing but that balance.
LONGEST_FIRST = ["test_distributed.py", "test_hybrid_targets.py", "test_parity.py", "test_batch_decode.py",
                 "test_sampling.py", "test_tree_sampling.py", "test_smollm2_pair.py", "test_serve_robustness.py",
                 "test_attention_shapes.py", "test_structured.py", "test_rows.py", "test_agent_clis.py",
                 "test_train.py", "test_sampling_bonus.py", "test_rough_edges.py", "test_gpu_check.py",
                 "test_serve_agents.py", "test_prefill_policy.py"]


def pytest_collection_modifyitems(config, items):
    """The longest files first; every file's tests stay together and in their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores. Part of the suite waits on servers, agent
    CLIs and ranks in other processes; on this 2-core machine 3 workers ran it in 683 s
    against 783 s for 2 (one run each, 2026-12-07), and in 702 s against 834 s for 4, with
    both cores busy 99 % of the run at 4 (2026-12-08)."""
    return (os.cpu_count() or 1) + 1
