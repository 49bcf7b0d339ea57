"""Bad input, signals and files (issue 11, part B).

Each behaviour is shown once on the installed `dflash2` command in a real
process (real SIGINT, real exit status, a single stderr line, and no file
touched but the run's own); the variations of each run in-process through the
same entry point and error boundary (`cli` fixture), which is ~1 s cheaper per case.
"""

import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from cli_process import Sandbox, catching_sigint, first_output
from helpers import drafter_folder, target_folder


@pytest.fixture(scope="module")
def pair():
    return {"target": target_folder("qwen3"), "drafter": drafter_folder("qwen3", "dflash2")}


@pytest.fixture
def box(tmp_path, pair):
    return Sandbox(tmp_path / "box", pair["target"], pair["drafter"])


def pair_args(pair):
    return ["--model", pair["target"], "--drafter", pair["drafter"]]


def one_line(code, err):
    """The in-process twin of Result.one_error_line."""
    assert code not in (0, None), err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], lines[0]
    return lines[0]


# == B1: Ctrl-C ============================================================================


def test_ctrl_c_during_imports_is_one_line_and_130(box, pair):
    r = box.interrupt(["generate", *pair_args(pair), "-p", "hi", "--json"], lambda p: catching_sigint(p, 0.15))
    assert r.code == 130, r.err
    assert r.err_lines == ["error: interrupted"], r.err
    assert r.out == b""
    assert box.touched() == set()


def test_ctrl_c_while_generating_json_prints_nothing_or_a_whole_object(box, pair):
    # A fixed block: the signal must land mid-generation, and --block-size auto decodes this
    # tiny pair plainly, fast enough to reach its EOS within the wait.
    args = ["generate", *pair_args(pair), "-p", "def f(x):", "-m", "100000", "--json", "--block-size", "16"]
    r = box.interrupt(args, lambda p: catching_sigint(p, 3.0))
    assert r.code == 130, r.err
    assert r.err_lines == ["error: interrupted"], r.err
    if r.out:  # the signal landed during the final write: the object is whole
        json.loads(r.out)
    assert box.touched() == set()


def test_ctrl_c_during_doctor_is_not_success(box, pair):
    r = box.interrupt(["doctor", *pair_args(pair)], first_output)
    assert r.code == 130, r.err
    assert r.err_lines == ["error: interrupted"], r.err
    assert box.touched() == set()


def test_interrupts_deferred_lets_a_write_finish():
    from dflash2_mlx.cli.stdio import interrupts_deferred

    done = []
    # Python's own handler, even when this runner inherited an ignored SIGINT.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                done.append("written")  # the handler ran, but only recorded the signal
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done == ["written"]


# == B2: train and its output folder ======================================================


@pytest.fixture(scope="module")
def train_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train-data")
    lines = [json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n" * 8}) for i in range(40)]
    (folder / "data.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "data.jsonl"


def train_args(pair, data, out, *extra):
    return ["train", "--model", pair["target"], "--data", data, "--out", out, "--seq-len", "32",
            "--block-size", "4", "--batch-size", "2", "--blocks-per-seq", "2", "--selector-rank", "8",
            "--eval-every", "1000", *extra]


def test_train_refuses_a_folder_holding_files_it_did_not_write(box, pair, train_data):
    out = box.root / "run"
    (out / "drafter").mkdir(parents=True)
    (out / "drafter" / "README.md").write_text("my notes")
    box.remember()  # the planted files are the user's: they must survive as they are
    r = box.run(train_args(pair, train_data, out, "--steps", "1"))
    line = r.one_error_line()
    assert "drafter/README.md" in line and "--out" in line
    assert box.touched() == set()


@pytest.mark.parametrize("flag,value", [
    ("--steps", "0"), ("--lr", "0"), ("--lr", "-1e-3"), ("--batch-size", "0"), ("--blocks-per-seq", "0"),
    ("--layers", "0"), ("--selector-rank", "0"), ("--eval-every", "0"), ("--save-every", "0"),
    ("--steps", "-5"), ("--lr", "nan"),
])
def test_train_refuses_non_positive_options_up_front(cli, pair, train_data, tmp_path, flag, value):
    out = tmp_path / "run"
    code, _, err = cli(train_args(pair, train_data, out, flag, value))
    assert flag in one_line(code, err)
    assert not out.exists()  # refused before the folder was even made


def test_rotation_deletes_only_its_own_checkpoints(pair, train_data, tmp_path):
    from dflash2_mlx.train.outdir import own_checkpoints
    from dflash2_mlx.train.setup import prepare
    from dflash2_mlx.train.trainer import TrainConfig

    out = tmp_path / "run"
    trainer = prepare(str(pair["target"]), [str(train_data)], out, block_size=4, seq_len=32, selector_rank=8,
                      config=TrainConfig(steps=10, batch_size=2, blocks_per_seq=2, keep_checkpoints=2))
    ckpts = out / "checkpoints"
    for step in (1, 2):
        trainer.step = step
        trainer.save()
    # Folders a user put there after the run started: one sorts after the run's own.
    for name in ("step-final", "step-9999999"):
        (ckpts / name).mkdir()
        (ckpts / name / "notes.txt").write_text(name)
    for step in (3, 4):
        trainer.step = step
        trainer.save()
    assert [s for s, _ in own_checkpoints(ckpts)] == [3, 4]
    assert (ckpts / "step-final" / "notes.txt").read_text() == "step-final"
    assert (ckpts / "step-9999999" / "notes.txt").read_text() == "step-9999999"
    latest = json.loads((ckpts / "latest" / "pointer.json").read_text())["folder"]
    assert (ckpts / latest / "state.json").exists() and latest == "step-0000004"


@pytest.mark.slow
def test_resume_with_different_steps_says_what_it_does(cli, pair, train_data, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli(train_args(pair, train_data, out, "--steps", "2", "--save-every", "2"))
    assert code == 0, err
    code, _, err = cli(train_args(pair, train_data, out, "--steps", "3", "--save-every", "2"))
    assert code == 0, err
    assert "--steps 2" in err and "3" in err and "schedule" in err, err
    code, _, err = cli(train_args(pair, train_data, out, "--steps", "1"))
    assert code == 0, err
    assert "nothing to train" in err, err


def test_a_patience_run_resumes_over_its_own_best_weights(cli, pair, train_data, tmp_path):
    # --patience keeps OUT/best (the best evaluation's weights); the resumed run must take the
    # folder as its own, not refuse it (it did: `make.sh`'s drafters stage could not go on).
    out = tmp_path / "run"
    args = ["--eval-every", "1", "--patience", "5", "--save-every", "1"]
    code, _, err = cli(train_args(pair, train_data, out, "--steps", "1", *args))
    assert code == 0, err
    assert (out / "best" / "state.json").is_file()
    code, _, err = cli(train_args(pair, train_data, out, "--steps", "2", *args))
    assert code == 0, err
    assert json.loads((out / "checkpoints" / "latest" / "pointer.json").read_text())["folder"] == "step-0000002"
    (out / "best" / "notes.txt").write_text("mine")  # a file the run did not write is still refused
    code, _, err = cli(train_args(pair, train_data, out, "--steps", "3", *args))
    assert code != 0 and "best" in one_line(code, err)


# == B3: --model without --drafter ========================================================


def test_model_without_drafter_says_no_drafter_was_given(box, pair):
    r = box.run(["generate", "--model", pair["target"], "-p", "hi"])
    line = r.one_error_line()
    assert "no drafter" in line and "--drafter" in line and "--ar" in line
    assert box.touched() == set()


@pytest.mark.parametrize("command", [["chat"], ["compare"], ["bench"]])
def test_every_command_needs_a_drafter_for_a_non_builtin_target(cli, pair, command):
    code, _, err = cli([*command, "--model", pair["target"]])
    assert "no drafter" in one_line(code, err)


def test_doctor_without_a_drafter_checks_the_target_alone(cli, pair):
    code, out, err = cli(["doctor", "--model", pair["target"], "--no-self-test"])
    assert code == 0, err
    assert "hidden_size" not in out  # no pair checks: there is no pair


# == B4: output paths =====================================================================


def test_bench_refuses_an_unwritable_json_path_before_the_work(box, pair):
    blocker = box.root / "a-file"
    blocker.write_text("x")
    box.remember()
    r = box.run(["bench", *pair_args(pair), "--json", blocker / "out.json", "-m", "2", "-r", "1"])
    line = r.one_error_line()
    assert "--json" in line and "a-file" in line
    assert box.touched() == set()


@pytest.mark.parametrize("args", [["compare", "--save"], ["bench", "--markdown"]])
def test_other_output_paths_are_checked_first(cli, pair, tmp_path, args):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = cli([args[0], *pair_args(pair), args[1], blocker / "out", "-m", "2"])
    assert args[1] in one_line(code, err)


def _limit_file_size():
    # Writes past 64 bytes fail with EFBIG (a full disk, as far as the writer can tell).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


@pytest.mark.slow
def test_bench_prints_its_table_when_the_final_write_fails(box, pair):
    dest = box.root / "results.json"
    r = box.run(["bench", *pair_args(pair), "--json", dest, "-m", "3", "-r", "1", "--block-sizes", "4",
                 "--max-prompts", "1", "--suite", "code"], preexec=_limit_file_size)
    line = r.one_error_line()
    assert "results.json" in line
    assert b"speedup" in r.out  # the table still came out
    assert box.touched() == set()  # no partial results.json, no temporary file


# == B5: bad input, one line each =========================================================


def test_invalid_utf8_prompt_on_argv(box, pair):
    r = box.run(["generate", *pair_args(pair), "-p", b"def f(\xff):"])
    line = r.one_error_line()
    assert "--prompt is not valid UTF-8" in line and "0xff at byte 6" in line
    assert box.touched() == set()


def test_invalid_utf8_prompt_on_stdin(pair, capsys, monkeypatch):
    import io
    import sys

    from dflash2_mlx.cli.main import main

    # Bytes under a text wrapper, as a pipe arrives: decoded by the CLI, strictly.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"def f(\xfe):")))
    with pytest.raises(SystemExit) as e:
        main(["generate", *map(str, pair_args(pair)), "-p", "-"])
    line = one_line(e.value.code, capsys.readouterr().err)
    assert "standard input is not valid UTF-8" in line and "0xfe at byte 6" in line


def test_closed_stdin(box, pair):
    r = box.run(["generate", *pair_args(pair), "-p", "-"], close_stdin=True)
    assert "standard input is closed" in r.one_error_line()
    r = box.run(["generate", *pair_args(pair), "-p", "hi", "-m", "2", "--json"], close_stdin=True)
    assert r.code == 0, r.err  # once mistaken for truncated drafter weights
    assert json.loads(r.out)["token_ids"]
    assert box.touched() == set()


@pytest.mark.parametrize("flag,value,words", [
    ("--seed", "-1", "seed"), ("--seed", str(2**64), "seed"), ("--temp", "nan", "temperature"),
    ("--temp", "inf", "temperature"), ("--top-p", "nan", "top_p"), ("--min-p", "inf", "min_p"),
])
def test_out_of_range_sampling_values(cli, pair, flag, value, words):
    code, _, err = cli(["generate", *pair_args(pair), "-p", "hi", flag, value])
    assert words in one_line(code, err)


def _target_copy(pair, tmp_path, change):
    folder = tmp_path / "target"
    import shutil

    shutil.copytree(pair["target"], folder)
    change(folder)
    return folder


def _truncate(folder):
    path = folder / "model.safetensors"
    os.truncate(path, path.stat().st_size // 2)


def _drop_hidden_size(folder):
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change,words", [
    (_truncate, "truncated"),
    (_drop_hidden_size, "hidden_size"),
    (lambda f: (f / "tokenizer.json").unlink(), "tokenizer"),
    (lambda f: (f / "tokenizer.json").write_text(""), "tokenizer.json"),
])
def test_broken_target_folders(cli, pair, tmp_path, change, words):
    target = _target_copy(pair, tmp_path, change)
    code, _, err = cli(["generate", "--model", target, "--drafter", pair["drafter"], "-p", "hi", "-m", "2"])
    assert words in one_line(code, err)


@pytest.mark.parametrize("key,value", [
    ("hidden_size", "64"), ("rms_norm_eps", "x"), ("layer_types", 5), ("dflash_config.block_size", "16"),
    ("dflash_config.target_layer_ids", "1,2"), ("head_dim", [1]), ("dflash_config", 3), ("rope_theta", "a"),
    ("num_attention_heads", 0), ("hidden_size", -64), ("architectures", "DFlash2DraftModel"),
    ("num_hidden_layers", 2.5), ("dflash_config.mask_token_id", "0"), ("attention_bias", "no"),
])
def test_drafter_config_fields_of_the_wrong_type(cli, pair, tmp_path, key, value):
    import shutil

    folder = Path(shutil.copytree(pair["drafter"], tmp_path / "drafter"))
    cfg = json.loads((folder / "config.json").read_text())
    *parents, last = key.split(".")
    node = cfg
    for k in parents:
        node = node[k]
    node[last] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    code, _, err = cli(["generate", "--model", pair["target"], "--drafter", folder, "-p", "hi", "-m", "2"])
    assert last in one_line(code, err)


@pytest.mark.parametrize("row", ["5", '"str"', '{"messages": "hi"}', '{"text": 5}',
                                 '{"prompt": "a", "response": 3}', '{"messages": [{"role": "user"}]}'])
def test_malformed_training_rows_name_their_line(cli, pair, tmp_path, row):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "fine"}\n' + row + "\n")
    code, _, err = cli(train_args(pair, data, tmp_path / "run", "--steps", "1"))
    assert "data.jsonl:2" in one_line(code, err)


@pytest.fixture(scope="module")
def w4a16_drafter(pair, tmp_path_factory):
    from dflash2_mlx.cli.main import main

    out = tmp_path_factory.mktemp("quantized") / "w4a16"
    with pytest.raises(SystemExit) as e:
        main(["quantize", "--drafter", str(pair["drafter"]), "--draft-quant", "w4a16", "--out", str(out)])
    assert e.value.code == 0
    return out


def test_saved_fp16_drafter_warns(cli, pair, w4a16_drafter):
    code, _, err = cli(["generate", "--model", pair["target"], "--drafter", w4a16_drafter, "-p", "hi", "-m", "2",
                        "--json"])
    assert code == 0, err
    # One warning line (a first run's bracketed note on the decode costs may follow it).
    lines = [line for line in err.splitlines() if not line.startswith("[decode costs: a first estimate")]
    assert len(lines) == 1 and err.startswith("warning: ") and "fp16" in err, err


def test_draft_quant_on_a_quantized_drafter_is_refused(cli, pair, w4a16_drafter):
    code, _, err = cli(["generate", "--model", pair["target"], "--drafter", w4a16_drafter, "-p", "hi", "-m", "2",
                        "--draft-quant", "w8a32"])
    assert "already quantized" in one_line(code, err)


def test_bench_block_size_beyond_the_drafter_is_refused(cli, pair):
    code, _, err = cli(["bench", *pair_args(pair), "--block-sizes", "4,32", "-m", "2", "-r", "1"])
    line = one_line(code, err)
    assert "32" in line and "16" in line


# == B6: the smaller things ===============================================================


def test_builtin_pair_says_it_is_a_demo(cli):
    code, out, err = cli(["generate", "-p", "def f(x):", "-m", "2"])
    assert code == 0, err
    assert "demo" in err and "standard library" in err
    code, out, err = cli(["generate", "-p", "def f(x):", "-m", "2", "--json"])
    assert code == 0 and "demo" not in err and "demo" not in out


def test_version(cli):
    from importlib.metadata import version

    code, out, err = cli(["--version"])
    assert code == 0 and version("dflash2-mlx") in out


def test_every_train_option_has_help():
    import typer

    from dflash2_mlx.cli.main import app

    command = typer.main.get_command(app).commands["train"]
    missing = [p.opts[0] for p in command.params if not (getattr(p, "help", None) or "").strip()]
    assert missing == []


def test_terminal_doc_knows_the_builtin_pair():
    doc = (Path(__file__).parent.parent / "docs" / "terminal.md").read_text()
    assert "No real model pair is bundled" not in doc


def test_compare_without_live_view_does_not_claim_a_replay(cli, pair):
    code, out, err = cli(["compare", *pair_args(pair), "-m", "4", "-r", "1", "--no-live"])
    assert code == 0, err
    assert "REPLAY" not in out and "at 1x" not in out


def test_chat_set_says_an_integer():
    from dflash2_mlx.errors import DFlashError
    from dflash2_mlx.text.chat_session import ChatSession
    from helpers import load_pair_for

    from dflash2_mlx.engine.pair import Pair

    target, tokenizer, drafter = load_pair_for("qwen3", "dflash2")
    session = ChatSession(Pair.make(target, drafter), tokenizer)
    with pytest.raises(DFlashError, match="needs an integer"):
        session.set("max_tokens", "many")


def test_bench_progress_reaches_the_last_run(pair):
    from dflash2_mlx.engine.pair import Pair
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target
    from dflash2_mlx.text.prompt import build_prompt
    from dflash2_mlx.tools.bench import run_bench
    from dflash2_mlx.tools.suites import builtin_prompts

    target, tokenizer = load_target(str(pair["target"]))
    p = Pair.make(target, load_drafter(str(pair["drafter"])))
    prompts = [(q, build_prompt(tokenizer, q.text, None, True, {})) for q in builtin_prompts(["code"], 1)]
    calls = []
    run_bench(target, tokenizer, prompts, pairs=[p], block_sizes=[4], repeats=1, max_tokens=2,
              on_run=lambda done, total, info: calls.append((done, total)))
    assert calls[-1][0] == calls[-1][1] == 3  # AR, mlx-lm plain and DFlash 2 block 4: the bar ends at 3/3


def test_a_ctrl_c_inside_importlibs_lock_callback_is_asked_for_again():
    # Python drops an exception raised inside importlib's module-lock weakref callback
    # ("Exception ignored in ... cb"): a Ctrl-C landing there during the start-up imports was
    # lost under load (the command went on and exited 0). The handler asks for it again instead.
    import sys
    import time

    from dflash2_mlx.cli import terminate

    namespace = {"sys": sys}
    exec(compile("def cb():\n    return sys._getframe()\n", "<frozen importlib._bootstrap>", "exec"), namespace)
    inside_cb = namespace["cb"]()
    got = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        terminate._interrupt(signal.SIGINT, inside_cb)  # held back: nothing raised here ...
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert got == [signal.SIGINT]  # ... and delivered again a moment later
    with pytest.raises(KeyboardInterrupt):  # anywhere else it is Python's own Ctrl-C
        terminate._interrupt(signal.SIGINT, sys._getframe())
