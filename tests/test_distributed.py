"""The target split over two MLX ring ranks on loopback gives the one-process
output, and a rank that dies ends the run everywhere with one line.

These start real ranks through `mlx.launch` (two processes on this 2-core
machine), so they are few: one sharded run per target family carries all its
decode cases (DFlash and DFlash 2 drafters, block sizes spread over 2..16
between the two families, T=0 and T=1 with one seed).
"""

import json
import os
import re
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

# Block sizes spread over 2..16 across the families; T=1 on some of each.
CASES = {
    "qwen3": [("dflash2", 2, 0.0), ("dflash2", 16, 1.0), ("dflash", 7, 0.0), ("dflash", 11, 1.0)],
    "llama": [("dflash2", 5, 0.0), ("dflash2", 13, 1.0), ("dflash", 3, 1.0), ("dflash", 16, 0.0)],
    # Hybrid (Gated DeltaNet: rollback replays the recurrent mixers) with an
    # untied head that shard() splits by vocabulary rows.
    "qwen3_5": [("dflash2", 4, 0.0), ("dflash", 9, 1.0)],
    # Pipeline parallel (mlx-lm has no shard() for it): the taps live on the
    # rank that runs their layer.
    "qwen3_next": [("dflash2", 6, 1.0), ("dflash", 12, 0.0)],
}
MAX_TOKENS = 16
# A bfloat16 target (the dtype real checkpoints ship in): the ranks round their split sums
# to bf16, so it is held to the stated logits bound, not to token identity.
BF16 = "qwen3-bfloat16"


def _spec(family: str) -> dict:
    if family == BF16:
        return {"target": str(target_folder("qwen3", dtype="bfloat16")),
                "drafters": {kind: str(drafter_folder("qwen3", kind)) for kind in ("dflash", "dflash2")},
                "cases": [], "max_tokens": MAX_TOKENS}
    return {
        "target": str(target_folder(family, tie=family != "qwen3_5")),
        "drafters": {kind: str(drafter_folder(family, kind)) for kind in ("dflash", "dflash2")},
        "cases": [{"kind": k, "B": B, "temp": T, "seed": 7} for k, B, T in CASES[family]],
        "max_tokens": MAX_TOKENS,
    }


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """One two-rank launch runs every family's cases (a launch costs seconds)."""
    folder = tmp_path_factory.mktemp("sharded")
    specs = {family: _spec(family) for family in [*CASES, BF16]}
    (folder / "spec.json").write_text(json.dumps(specs))
    run = subprocess.Popen(
        [LAUNCH, "-n", "2", "--backend", "ring", PYTHON, str(HERE / "distributed_driver.py"),
         str(folder / "spec.json"), str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        start_new_session=True,  # its own process group: a hung run is killed whole
    )
    try:
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    ranks = [folder / f"rank-{r}.json" for r in (0, 1)]
    assert all(p.exists() for p in ranks), err[-2000:]
    return specs, [json.loads(p.read_text()) for p in ranks]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(CASES))
def test_two_ranks_match_one_process(family, sharded_runs):
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target

    from distributed_cases import case_key, run_cases

    specs, ranks = sharded_runs
    spec = specs[family]
    r0, r1 = (r[family] for r in ranks)

    # The one-process reference, in this process.
    target, _ = load_target(spec["target"])
    drafters = {k: load_drafter(p) for k, p in spec["drafters"].items()}
    one = run_cases(target, drafters, spec["cases"], MAX_TOKENS)

    assert r0["ranks"] == r1["ranks"] == 2
    if family == "qwen3_next":  # an all_sum per stage, one more for the features when tapping
        assert 2 < r0["collectives_per_pass"] < 3
    elif family != "qwen3_5":  # whose Gated DeltaNet all_sums are written inline (not counted)
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


@pytest.mark.slow
def test_bf16_ranks_stay_within_the_stated_bound(sharded_runs):
    """bfloat16: each rank rounds its partial sums before the all_sum, so logits move against
    one process, by at most BF16_SPLIT_BOUND of their scale (what the closing lines and the
    doctor say); the ranks still agree with each other bitwise."""
    from dflash2_mlx.engine.target.sharded import BF16_SPLIT_BOUND, split_parity
    from dflash2_mlx.loading.checkpoints import load_drafter, load_target

    from distributed_cases import run_cases

    specs, ranks = sharded_runs
    r0, r1 = (r[BF16] for r in ranks)
    target, _ = load_target(specs[BF16]["target"])
    assert "bfloat16" in str(target.activation_dtype) and "up to the rounding" in split_parity(target.activation_dtype)
    one = run_cases(target, {k: load_drafter(p) for k, p in specs[BF16]["drafters"].items()}, [], MAX_TOKENS)
    assert r0["digest"] == r1["digest"]
    ref, got = np.array(one["logits"]), np.array(r0["logits"])
    assert not np.array_equal(ref, got)  # the rounding is there: this is what the bound is about
    assert np.abs(got - ref).max() <= BF16_SPLIT_BOUND * np.abs(ref).max()


# -- the command line -------------------------------------------------------------------


def _dflash2(*args, **kw):
    return subprocess.Popen([PYTHON, "-m", "dflash2_mlx.cli", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), **kw)


def _generate_args(family="qwen3", max_tokens=16):
    return ["generate", "--model", target_folder(family), "--drafter", drafter_folder(family, "dflash2"),
            "--prompt", "def main():", "--ignore-chat-template", "--max-tokens", max_tokens]


@pytest.mark.slow
def test_generate_two_ranks_json_matches_one_process(cli, tmp_path):
    """Through --hostfile (two local hosts: the path to several Macs) and a
    prompt on stdin (read by the launching command: the ranks' stdin never ends)."""
    code, out, err = cli(_generate_args() + ["--json", "--block-size", "6"])
    assert code == 0, err
    one = json.loads(out)
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    args = ["-" if a == "def main():" else a for a in _generate_args()]
    run = subprocess.run([PYTHON, "-m", "dflash2_mlx.cli", *map(str, args), "--json", "--block-size", "6",
                          "--hostfile", hosts], input="def main():", capture_output=True, text=True,
                         env=_env(), timeout=180)
    assert run.returncode == 0, run.stderr
    two = json.loads(run.stdout)  # only rank 0 printed: one JSON object
    assert two["prompt_token_ids"] == one["prompt_token_ids"], (one["prompt_token_ids"], two["prompt_token_ids"])
    assert two["token_ids"] == one["token_ids"] and two["text"] == one["text"]
    stats = two["stats"]
    assert stats["ranks"] == 2 and one["stats"]["ranks"] == 1
    assert stats["target_passes"] == one["stats"]["target_passes"]
    assert stats["collectives_per_pass"] == 2 * 4  # tiny target: 4 layers, 2 all_sums each
    assert stats["collective_s_per_pass"] > 0


def _rank_pids(parent: int) -> dict[int, int]:
    """rank -> pid of the ranks under `parent` (they carry MLX_RANK)."""
    found, todo = {}, [parent]
    while todo:
        pid = todo.pop()
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        todo += [int(k) for k in kids]
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"MLX_RANK=") and b"python" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found[int(item[9:])] = pid
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_rank_that_dies_ends_every_rank_with_one_line(how):
    """SIGKILL: the survivor's collective fails at once. SIGSTOP (a machine gone
    silent, sockets left open): the watchdog ends the survivor after
    --rank-timeout, the parent kills the stopped rank."""
    run = _dflash2(*_generate_args(max_tokens=100000), "--processes", "2", "--rank-timeout", "3")
    assert run.stdout.read(1)  # rank 0 is generating
    ranks = _rank_pids(run.pid)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    tic = time.monotonic()
    try:
        run.wait(timeout=45)
    finally:
        if run.poll() is None:  # leave nothing behind on failure
            for pid in [*ranks.values(), run.pid]:
                os.kill(pid, signal.SIGKILL)
    took = time.monotonic() - tic
    err = run.stderr.read()
    assert run.returncode == 1
    assert err.count("\n") == 1 and err.startswith("error: "), err
    if how == "killed":
        assert "rank 1 was killed (SIGKILL)" in err
        assert took < 15
    else:
        assert "rank 0: lost contact with another rank: no target pass finished for 3 s" in err
        assert took < 3 + 5 + 15  # timeout + grace + slack for a loaded machine
    for pid in ranks.values():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.parametrize("family, wanted", [
    ("gemma3_text", "target model_type 'gemma3_text' cannot be split over ranks: mlx-lm gives it no tensor or "
                    "pipeline parallelism; run it in one process (drop --processes / --hostfile)"),
    ("muse_glimmer", "target model_type 'muse_glimmer' cannot be split over ranks: mlx-lm gives it no tensor or "
                     "pipeline parallelism; run it in one process (drop --processes / --hostfile)"),
])
def test_family_that_cannot_be_split_is_refused_by_name(cli, family, wanted):
    """Refused before any rank starts (the target is on this disk)."""
    code, out, err = cli(["generate", "--model", target_folder(family), "--ar", "--prompt", "x",
                          "--ignore-chat-template", "--processes", "2"])
    assert (code, out, err) == (1, "", f"error: {wanted}\n")


def test_heads_that_do_not_divide_are_refused(cli):
    code, out, err = cli(_generate_args() + ["--processes", "3"])
    assert (code, out) == (1, "") and err == ("error: target num_attention_heads 4 does not split over 3 ranks: "
                                              "use a rank count that divides it\n")


# -- the parent's reading of the ranks (no processes) --------------------------------------


def test_parent_names_the_first_cause():
    import io

    from dflash2_mlx.cli.distributed import RankOutcome

    def outcome(*lines):
        o, out = RankOutcome(), io.StringIO()
        for line in lines:
            o.feed(line + "\n", out)
        return o, out.getvalue()

    # A killed rank 1: rank 0's lost peer and the launcher's SIGTERM are consequences.
    o, shown = outcome("[ring] Socket 3 was closed by the peer", "x Sending to socket 4 failed with errno 104",
                       "[rank 0] error: internal error: RuntimeError: [ring] connection to a peer was lost",
                       "\x1b[33m[WARN] Node with rank 0 exited with code 1 \x1b[0m",
                       "\x1b[33m[WARN] Node with rank 1 exited with code -9 \x1b[0m")
    assert shown == "" and o.failure(0).startswith("rank 1 was killed (SIGKILL)")
    o, _ = outcome("[WARN] Node with rank 1 exited with code -9", "[WARN] Node with rank 0 exited with code -15")
    assert o.failure(0).startswith("rank 1 was killed (SIGKILL)")
    # The same error on every rank is shown once, a rank's own error with its rank.
    o, _ = outcome("[rank 0] error: bad drafter", "[rank 1] error: bad drafter")
    assert o.failure(0) == "bad drafter"
    o, _ = outcome("[rank 1] error: out of memory", "[rank 0] error: lost contact with another rank: ...")
    assert o.failure(0) == "rank 1: out of memory"
    # Ordinary lines pass once; a clean run is no failure.
    o, shown = outcome("warning: x", "\x1b[33m[WARN]", " Node with rank 1 exited with code 0 ", "warning: x",
                       "[WARN] Node with rank 0 exited with code 0")
    assert shown == "warning: x\n" and o.failure(0) is None


def test_hostfile_and_flag_errors(cli, tmp_path):
    bad = tmp_path / "hosts.json"
    bad.write_text("not json")
    for extra, wanted in [(["--hostfile", tmp_path / "none.json"], "does not exist"),
                          (["--hostfile", bad], "is not JSON"),
                          (["--hostfile", bad, "--processes", "2"], "not both")]:
        code, out, err = cli(_generate_args() + extra)
        assert code == 1 and err.count("\n") == 1 and wanted in err, err


def test_timed_projection_is_the_sharded_one_bitwise():
    """The instrumented sharded-to-all projections compute exactly what mlx's
    own do (plain and quantized, with bias), and the clock counts and times
    each all_sum. A one-rank group: all_sum is the identity."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.nn.layers.distributed import shard_linear

    from dflash2_mlx.engine.target.collectives import CollectiveClock, TimedShardedToAll, instrument

    group = mx.distributed.init()
    mx.random.seed(0)
    plain = nn.Linear(64, 32, bias=True)
    quant = nn.QuantizedLinear.from_linear(nn.Linear(64, 32, bias=False), group_size=32, bits=4)
    block = nn.Module()
    block.a = shard_linear(plain, "sharded-to-all", group=group)
    block.b = shard_linear(quant, "sharded-to-all", group=group)
    x = mx.random.normal((1, 5, 64))
    want = [block.a(x), block.b(x)]
    clock = CollectiveClock(group.size(), timed=True)
    assert instrument(block, clock) == 2
    assert isinstance(block.a, TimedShardedToAll) and isinstance(block.b, TimedShardedToAll)
    got = [block.a(x), block.b(x)]
    assert all(mx.array_equal(g, w).item() for g, w in zip(got, want))
    assert clock.collectives == 2 and clock.seconds > 0 and clock.complete


def test_closing_lines_name_the_ranks():
    from dflash2_mlx.cli.ui import closing_lines
    from dflash2_mlx.text.stats import GenerationStats

    base = dict(prompt_tokens=3, generation_tokens=9, prompt_tps=1.0, generation_tps=2.0, target_passes=4,
                mean_acceptance_length=2.0, acceptance_by_position=[0.5], acceptance_histogram=[2, 2],
                drafted=4, accepted=2, peak_memory_gb=0.1, backend="cpu", mode="dflash2", block_size=2)
    assert not any("ranks" in line for line in closing_lines(GenerationStats(**base)))
    lines = closing_lines(GenerationStats(**base, ranks=2, collectives_per_pass=8.0, collective_s_per_pass=0.0021))
    assert lines[-1] == "[target split over 2 ranks: 8 collectives per pass, 2.10 ms in them per pass]"
    # The line users see says which parity holds, from the target's dtype (engine/target/sharded.py).
    import mlx.core as mx

    from dflash2_mlx.engine.target.sharded import split_parity

    for dtype, words in ((mx.float32, "token-identical to one process"), (mx.bfloat16, "up to the rounding")):
        stats = GenerationStats(**base, ranks=2, collectives_per_pass=8.0, split_parity=split_parity(dtype))
        assert words in closing_lines(stats)[-1] and closing_lines(stats)[-1].startswith("[ranks: ")


@pytest.mark.slow
def test_chat_two_ranks_same_answers_and_cache_reuse():
    """Every rank reads the relayed input; two turns (the second continues from
    the caches) and a /set that switches to sampling give rank 0 the same text
    as one process."""
    args = [PYTHON, "-m", "dflash2_mlx.cli", "chat", "--model", str(target_folder("qwen3")), "--drafter",
            str(drafter_folder("qwen3", "dflash2")), "--max-tokens", "10", "--seed", "3",
            "--ignore-chat-template", "--no-color", "--block-size", "5"]
    turns = "def main():\n/set temp 1\n    return\n"
    runs = [subprocess.run(args + extra, input=turns, capture_output=True, text=True, env=_env(), timeout=180)
            for extra in ([], ["--processes", "2"])]
    for run in runs:
        assert run.returncode == 0, run.stderr
    answers = [[line for line in run.stdout.splitlines() if line.startswith(">>>")] for run in runs]
    assert len(answers[0]) == 4 and answers[0] == answers[1]  # two answers, the /set notice, bye
    # The second turn prefilled only its new tokens on the ranks too.
    reuse = [re.findall(r"\((\d+) new, (\d+) cached\)", run.stdout) for run in runs]
    assert reuse[0] == reuse[1] and len(reuse[1]) == 2 and int(reuse[1][1][1]) > 0, reuse


@pytest.mark.slow
def test_serve_two_ranks_answers_as_one_process(tmp_path):
    """`serve --processes 2`: rank 0 serves HTTP, rank 1 runs the same
    generations; two chat turns at T=0 (the second continues from the prompt
    cache) read as a one-process server's, and SIGTERM drains every rank."""
    import openai

    from serve_helpers import Server

    args = ["--model", str(target_folder("qwen3")), "--drafter", str(drafter_folder("qwen3", "dflash2")),
            "--block-size", "5", "--max-tokens", "10"]
    servers = [Server(*args, tmp=tmp_path, wait=False), Server(*args, "--processes", "2", tmp=tmp_path, wait=False)]
    try:
        answers = []
        for s in servers:
            s.wait_ready()
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
            messages, texts = [{"role": "user", "content": "def main():"}], []
            for turn in ("    return", "print(1)"):
                r = client.chat.completions.create(model=args[1], messages=messages, temperature=0)
                texts.append((r.choices[0].message.content, r.usage.completion_tokens,
                              r.usage.prompt_tokens_details.cached_tokens > 0,
                              r.usage.model_extra["dflash2"]["target_passes"]))
                messages += [{"role": "assistant", "content": texts[-1][0]}, {"role": "user", "content": turn}]
            answers.append(texts)
        assert sorted(_rank_pids(servers[1].proc.pid)) == [0, 1]  # still serving, over two ranks
        assert answers[0] == answers[1] and answers[1][0][1] > 0 and answers[1][1][2], answers
    finally:
        outcomes = [s.stop() for s in servers]
    for code, log in outcomes:
        assert code == 0 and "Traceback" not in log and "error" not in log, log
