"""Property: whatever values reach the CLI's numeric options, and whatever bytes
sit in config.json, tokenizer.json or a JSONL data file, `dflash2` either runs
or stops with one clean `error:` line and a non-zero status: never an internal
error, never a traceback.

In-process through the real entry point and error boundary (a process per
example would cost a second of imports each). Derandomized with few examples,
so CI runs the same cases every time and stays fast.
"""

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import drafter_folder, target_folder

FUZZ = settings(max_examples=12, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def run_cli(argv, capsys):
    from dflash2_mlx.cli.main import main

    capsys.readouterr()
    old = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with pytest.raises(SystemExit) as e:
            main([a if isinstance(a, str) else str(a) for a in argv])
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return e.value.code, out, err


def assert_clean(code, err, may_succeed=True):
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 0 and may_succeed:
        return
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert code not in (0, None), err
    assert len(lines) == 1 and lines[0].startswith("error: "), err


# Values as they arrive on a command line: numbers of every size and sign,
# non-finite floats, and text that is not a number at all.
ANY_NUMBER = st.one_of(
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "-0", "-1", "nan", "-inf", "1e999", "", " ", "x", "0x10", "1_000", "٣", "2**64"]),
)
# --max-tokens: a huge valid value would just generate for a long time.
SMALL_OR_BAD = st.one_of(st.integers(-2**70, 3).map(str), st.sampled_from(["nan", "inf", "x", "", "1e999", "3.5"]))

GENERATE_OPTIONS = ["--temp", "--top-p", "--top-k", "--min-p", "--seed", "--block-size"]
TRAIN_OPTIONS = ["--steps", "--lr", "--batch-size", "--blocks-per-seq", "--layers", "--selector-rank", "--eval-every",
                 "--save-every", "--seq-len", "--block-size", "--regenerate", "--seed", "--processes"]


@FUZZ
@given(flag=st.sampled_from(GENERATE_OPTIONS), value=ANY_NUMBER)
def test_generate_numeric_options(capsys, flag, value):
    pair = ["--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2")]
    code, out, err = run_cli(["generate", *pair, "-p", "def f(x):", "-m", "2", "--json", f"{flag}={value}"], capsys)
    assert_clean(code, err)
    if code == 0:
        assert len(json.loads(out)["token_ids"]) <= 2


@FUZZ
@given(value=SMALL_OR_BAD)
def test_max_tokens(capsys, value):
    pair = ["--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2")]
    code, _, err = run_cli(["generate", *pair, "-p", "hi", "--json", f"--max-tokens={value}"], capsys)
    assert_clean(code, err)


@FUZZ
@given(flag=st.sampled_from(TRAIN_OPTIONS), value=ANY_NUMBER)
def test_train_numeric_options(capsys, tmp_path_factory, flag, value):
    # The data does not exist: every example ends in an error, the option's own or the data's.
    out = tmp_path_factory.mktemp("run") / "out"
    code, _, err = run_cli(["train", "--model", target_folder("qwen3"), "--data", out.parent / "missing.jsonl",
                            "--out", out, f"{flag}={value}"], capsys)
    assert_clean(code, err, may_succeed=False)


# -- files --------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def key_paths(config: dict, prefix=()):
    for k, v in config.items():
        yield (*prefix, k)
        if isinstance(v, dict):
            yield from key_paths(v, (*prefix, k))


def mutated(config: dict, path, value) -> bytes:
    config = json.loads(json.dumps(config))
    node = config
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return json.dumps(config).encode()


def file_contents(valid: dict):
    """Random bytes, or the valid JSON with one key (at any depth) set to a random value."""
    paths = sorted(key_paths(valid))
    return st.one_of(st.binary(max_size=64),
                     st.builds(lambda p, v: mutated(valid, p, v), st.sampled_from(paths), JSON_VALUES))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    return {"target": Path(shutil.copytree(target_folder("qwen3"), root / "target")),
            "drafter": Path(shutil.copytree(drafter_folder("qwen3", "dflash2"), root / "drafter"))}


def _valid(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


DRAFTER_CONFIG = _valid(drafter_folder("qwen3", "dflash2"), "config.json")
TARGET_CONFIG = _valid(target_folder("qwen3"), "config.json")
TOKENIZER = _valid(target_folder("qwen3"), "tokenizer.json")


def _generate_with(folders, capsys, which: str, name: str, content: bytes, original: dict):
    path = folders[which] / name
    path.write_bytes(content)
    try:
        return run_cli(["generate", "--model", folders["target"], "--drafter", folders["drafter"], "-p", "hi",
                        "-m", "1", "--json"], capsys)
    finally:
        path.write_text(json.dumps(original))


@FUZZ
@given(content=file_contents(DRAFTER_CONFIG))
def test_drafter_config_bytes(folders, capsys, content):
    code, _, err = _generate_with(folders, capsys, "drafter", "config.json", content, DRAFTER_CONFIG)
    assert_clean(code, err)


@FUZZ
@given(content=file_contents(TARGET_CONFIG))
def test_target_config_bytes(folders, capsys, content):
    code, _, err = _generate_with(folders, capsys, "target", "config.json", content, TARGET_CONFIG)
    assert_clean(code, err)


@FUZZ
@given(content=file_contents({k: v for k, v in TOKENIZER.items() if k != "model"} | {"model": {"type": "BPE"}}))
def test_tokenizer_json_bytes(folders, capsys, content):
    code, _, err = _generate_with(folders, capsys, "target", "tokenizer.json", content, TOKENIZER)
    assert_clean(code, err)


ROWS = st.one_of(
    JSON_VALUES.map(json.dumps),
    st.fixed_dictionaries({}, optional={"text": JSON_VALUES, "prompt": JSON_VALUES, "response": JSON_VALUES,
                                        "messages": JSON_VALUES}).map(json.dumps),
    st.text(max_size=12),
)


@FUZZ
@given(lines=st.lists(ROWS, min_size=1, max_size=4), raw=st.binary(max_size=16))
def test_training_jsonl(capsys, tmp_path_factory, lines, raw):
    folder = tmp_path_factory.mktemp("data")
    data = folder / "data.jsonl"
    data.write_bytes("\n".join(lines).encode() + b"\n" + raw)
    # No such target: rows that read fine end at the target, one clean line either way.
    code, _, err = run_cli(["train", "--model", folder / "no-target", "--data", data, "--out", folder / "run"],
                           capsys)
    assert_clean(code, err, may_succeed=False)
