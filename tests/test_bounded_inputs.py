"""Every input bounded (issue 21): the prompt by the target's context, --tree by
the drafter's lattice, --port by TCP, analyze's --block-size parsed and its
held-out hint true; and a long prefill shows its progress on a terminal only.

User-facing refusals run through the real CLI (a subprocess, or the in-process
entry point with its error boundary) and the real server."""

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from cli_process import Sandbox
from helpers import drafter_folder, load_pair_for, target_folder
from serve_helpers import Server

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.errors import DFlashError, PromptTooLongError

LIMIT = 2048  # the tiny targets' and the built-in target's max_position_embeddings
LONG_TEXT = "def f(x):\n    return x\n" * 400  # over 2,048 tokens with either tokenizer


@pytest.fixture(scope="module")
def loaded():
    target, tokenizer, drafter = load_pair_for("qwen3")
    return target, tokenizer, drafter


@pytest.fixture(scope="module")
def paths():
    return {"target": str(target_folder("qwen3")), "drafter": str(drafter_folder("qwen3", "dflash2"))}


@pytest.fixture
def box(tmp_path, paths):
    return Sandbox(tmp_path / "box", paths["target"], paths["drafter"])


def pair_args(paths):  # the tiny pair's flags
    return ["--model", paths["target"], "--drafter", paths["drafter"]]


def ids_of(n: int, offset: int = 0) -> list[int]:
    """`n` token ids of the tiny vocabulary, none of them EOS (0)."""
    return [1 + (offset + 7 * i) % 383 for i in range(n)]


# -- 1. the context -----------------------------------------------------------------------


@pytest.mark.parametrize("args, limit", [
    (dict(max_position_embeddings=2048), 2048),
    (dict(max_position_embeddings=2048, rope_scaling=None), 2048),
    # Qwen3 with YaRN as its model card says: factor × the trained length.
    (dict(max_position_embeddings=40960,
          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), 131072),
    # Llama 3.1: max_position_embeddings is already the scaled context (8 × 8192 is less).
    (dict(max_position_embeddings=131072,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}), 131072),
    # YaRN / dynamic NTK without the trained length: max_position_embeddings is it.
    (dict(max_position_embeddings=32768, rope_scaling={"type": "yarn", "factor": 4.0}), 131072),
    (dict(max_position_embeddings=4096, rope_scaling={"type": "dynamic", "factor": 2.0}), 8192),
    # Gemma 3: a linear factor on a max_position_embeddings that is already the scaled context.
    (dict(max_position_embeddings=131072, rope_scaling={"rope_type": "linear", "factor": 8.0}), 131072),
    # Types mlx-lm applies without scaling extend nothing, whatever they carry.
    (dict(max_position_embeddings=4096,
          rope_scaling={"factor": 4.0, "original_max_position_embeddings": 4096}), 4096),
    (dict(max_position_embeddings=262144, rope_scaling={"type": "mrope", "mrope_section": [11, 11, 10]}), 262144),
    # transformers >= 5 nests the scaling under rope_parameters.
    (dict(max_position_embeddings=32768, rope_scaling=None,
          rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}), 65536),
    (dict(max_position_embeddings=None), None),
    (dict(), None),
])
def test_context_limit_reads_max_position_embeddings_and_rope_scaling(args, limit):
    from dflash2_mlx.text.context import context_limit

    assert context_limit(SimpleNamespace(args=SimpleNamespace(**args))) == limit


def test_context_limit_of_a_loaded_target(loaded):
    from dflash2_mlx.text.context import check_context, context_limit

    target = loaded[0]
    assert context_limit(target) == LIMIT
    assert check_context(target, LIMIT - 10) == 10
    for n in (LIMIT, LIMIT + 1):
        with pytest.raises(PromptTooLongError) as e:
            check_context(target, n)
        assert e.value.limit == LIMIT and e.value.prompt_tokens == n
        assert f"{n:,} tokens" in str(e.value) and "2,048" in str(e.value) and "shorten it" in str(e.value)


@pytest.mark.parametrize("with_drafter", [True, False])
def test_stream_generate_refuses_a_prompt_over_the_context_before_prefill(loaded, with_drafter):
    from dflash2_mlx.text.generate import stream_generate

    target, tokenizer, drafter = loaded
    pair = Pair.make(target, drafter if with_drafter else None)
    prefilled = []
    responses = stream_generate(pair, tokenizer, ids_of(LIMIT + 5), DecodeRequest(max_tokens=4, block_size=4),
                                prompt_progress_callback=lambda done, total: prefilled.append(done))
    with pytest.raises(PromptTooLongError) as e:
        next(responses)
    assert e.value.prompt_tokens == LIMIT + 5 and e.value.limit == LIMIT
    assert prefilled == []  # refused before a single token ran


def test_a_generation_stops_when_the_context_is_full(loaded):
    """prompt + max_tokens past the context: the answer ends at the context's
    end with finish_reason "length" (llama.cpp's n_ctx rule), never past it."""
    from dflash2_mlx.text.generate import stream_generate

    target, tokenizer, drafter = loaded
    for pair in (Pair.make(target, drafter), Pair.make(target)):
        out = list(stream_generate(pair, tokenizer, ids_of(LIMIT - 6), DecodeRequest(max_tokens=100, block_size=4)))
        assert 1 <= len(out) <= 6
        if len(out) < 6:  # an EOS came first
            assert out[-1].token in tokenizer.eos_token_ids
        else:
            assert out[-1].finish_reason == "length"


def test_the_chat_session_counts_the_whole_conversation(loaded):
    from dflash2_mlx.text.chat_session import ChatSession

    target, tokenizer, drafter = loaded
    session = ChatSession(Pair.make(target, drafter), tokenizer, request=DecodeRequest(max_tokens=4, block_size=4))
    first = session.ask("Write a loop")
    assert first.finish_reason in ("stop", "length")
    before = (list(session.messages), list(session.cache.tokens))
    with pytest.raises(PromptTooLongError) as e:
        session.ask(LONG_TEXT)
    assert "the conversation has" in str(e.value)
    assert (session.messages, session.cache.tokens) == before  # nothing changed


def test_generate_refuses_a_long_prompt_in_one_line(box, paths):
    r = box.run(["generate", *pair_args(paths), "-p", "-", "--json"], input=LONG_TEXT.encode())
    line = r.one_error_line()
    assert r.code == 1 and "2,048 tokens" in line and "shorten it" in line and "tokens, over" in line
    assert r.out == b""


def test_chat_refuses_a_turn_over_the_context_and_goes_on(box, paths):
    r = box.run(["chat", *pair_args(paths), "-m", "4", "--block-size", "4", "--no-color"],
                input=(LONG_TEXT.replace("\n", " ") + "\nhello\n/quit\n").encode())
    assert r.code == 0, r.err
    text = r.out.decode() + r.err
    assert "the conversation would have" in text and "/reset" in text and "Traceback" not in text


SERVED_LIMIT = 256  # the served target's context: the built-in one, with its config saying 256


def short_context_builtin(folder: Path) -> Path:
    """The built-in target with `max_position_embeddings` lowered to SERVED_LIMIT
    (the weights linked, not copied): the server's default limit must follow the
    model, and a prompt at its end prefills in a moment instead of 2,047 tokens."""
    from dflash2_mlx.loading.builtin import resolve_builtin

    source = Path(resolve_builtin("builtin", "target"))
    folder.mkdir()
    for f in source.iterdir():
        if f.name != "config.json":
            (folder / f.name).symlink_to(f)
    config = json.loads((source / "config.json").read_text())
    assert config["max_position_embeddings"] > SERVED_LIMIT
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": SERVED_LIMIT}))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounded")
    target = short_context_builtin(tmp / "target")
    s = Server("--model", str(target), "--drafter", "builtin", "--block-size", "4", "--cache-bytes", "0", tmp=tmp)
    yield s
    code, log = s.stop()
    assert code == 0 and "Traceback" not in log, log


def test_server_refuses_a_prompt_over_the_context_with_a_400_in_each_protocol(server):
    """The default --max-prompt-tokens is the model's context (here 256), not 32,768."""
    messages = [{"role": "user", "content": LONG_TEXT}]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 4}, timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and f"{SERVED_LIMIT:,}" in error["message"] and "shorten it" in error["message"]
    # Streamed: refused before the event stream starts.
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "stream": True},
                   timeout=120)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = httpx.post(server.url + "/v1/messages", json={"messages": messages, "max_tokens": 4}, timeout=120)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert f"{SERVED_LIMIT:,}" in body["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # still serving


def test_server_answer_stops_at_the_end_of_the_context(server):
    from mlx_lm.utils import load_tokenizer

    from dflash2_mlx.loading.builtin import resolve_builtin

    tokenizer = load_tokenizer(Path(resolve_builtin("builtin", "target")))
    ids = [t for t in tokenizer.encode(LONG_TEXT) if t not in tokenizer.eos_token_ids][: SERVED_LIMIT - 1]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ids, "max_tokens": 50}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == SERVED_LIMIT - 1 and body["usage"]["completion_tokens"] == 1
    assert body["choices"][0]["finish_reason"] in ("length", "stop")


# -- 2. prefill progress ------------------------------------------------------------------


def test_prompt_progress_callback_counts_up_to_the_prompt(loaded):
    from dflash2_mlx.text.generate import stream_generate

    target, tokenizer, drafter = loaded
    for pair in (Pair.make(target, drafter), Pair.make(target)):
        calls = []
        request = DecodeRequest(max_tokens=3, block_size=4, prefill_step_size=64)
        list(stream_generate(pair, tokenizer, ids_of(300), request,
                             prompt_progress_callback=lambda done, total: calls.append((done, total))))
        assert calls == [(n, 300) for n in (0, 64, 128, 192, 256, 300)]


def test_prompt_progress_callback_in_a_chat_counts_the_new_tokens(loaded):
    from dflash2_mlx.text.chat_session import ChatSession

    target, tokenizer, drafter = loaded
    session = ChatSession(Pair.make(target, drafter), tokenizer,
                          request=DecodeRequest(max_tokens=3, block_size=4, prefill_step_size=8))
    session.ask("Write a loop")
    calls = []
    turn = session.ask("Now make it faster", prompt_progress_callback=lambda d, t: calls.append((d, t)))
    totals = {t for _, t in calls}
    assert totals == {turn.prefilled_tokens} and calls[0][0] == 0 and calls[-1][0] == turn.prefilled_tokens
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and len(calls) > 2


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


def test_prefill_progress_waits_draws_one_line_and_erases_it():
    from dflash2_mlx.cli.progress import PREFILL_QUIET_S, PrefillProgress

    out, clock = FakeTerminal(), Clock()
    progress = PrefillProgress(out, clock)
    progress(0, 10_000)
    clock.now += PREFILL_QUIET_S / 2
    progress(2048, 10_000)
    assert out.getvalue() == ""  # a short prefill draws nothing
    clock.now += PREFILL_QUIET_S
    progress(4096, 10_000)
    progress(6144, 10_000)
    drawn = out.getvalue()
    assert drawn.count("\r") == 2 and "\n" not in drawn and "4,096 / 10,000" in drawn and "6,144 / 10,000" in drawn
    progress(10_000, 10_000)
    assert out.getvalue().endswith("\r\x1b[K")  # erased: the text that follows starts clean
    with PrefillProgress(out, clock) as again:  # an error or Ctrl-C mid-prefill erases it too
        again(0, 10_000)
        clock.now += 2 * PREFILL_QUIET_S
        again(100, 10_000)
    assert out.getvalue().endswith("\r\x1b[K")
    assert PrefillProgress(None).callback is None  # off a terminal: no callback at all


def run_in_process(argv, stderr) -> tuple[int, str, str]:
    """`dflash2 ARGV` through the real entry point, with `stderr` as the error stream."""
    from dflash2_mlx.cli.main import main

    out = io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr, sys.stdin = out, stderr, io.StringIO("")
    try:
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in argv])
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return e.value.code, out.getvalue(), stderr.getvalue()


def test_generate_draws_prefill_progress_on_a_terminal_only(paths, monkeypatch):
    from dflash2_mlx.cli import progress

    argv = ["generate", *pair_args(paths), "-p", LONG_TEXT[:2000], "-m", "4", "--block-size", "4", "--json"]
    code, out, err = run_in_process(argv, io.StringIO())  # not a terminal
    assert code == 0, err
    assert "prefill" not in err and "\r" not in err
    monkeypatch.setattr(progress, "PREFILL_QUIET_S", 0.0)  # every prefill counts as long
    monkeypatch.setenv("TERM", "xterm")
    code, out, err = run_in_process(argv, FakeTerminal())
    assert code == 0, err
    total = len(json.loads(out)["prompt_token_ids"])
    assert f"prefill 0 / {total:,} tokens" in err and err.endswith("\r\x1b[K")
    code, _, err = run_in_process(argv, io.StringIO())
    assert code == 0 and "prefill" not in err  # still nothing off a terminal


# -- 3. --tree bounded by the drafter's lattice ---------------------------------------------


def test_max_tree_rows_follows_the_block_and_top_k(loaded):
    from dflash2_mlx.engine.tree.cycle import check_tree_rows, max_tree_rows

    target, _, drafter = loaded
    c = drafter.config
    assert max_tree_rows(drafter) == 1 + (c.block_size - 1) * c.selector_top_k == 241
    pair = Pair.make(target, drafter)
    check_tree_rows(pair, 241)
    with pytest.raises(DFlashError, match="at most 241 rows"):
        check_tree_rows(pair, 242)
    check_tree_rows(Pair.make(target), 10**6)  # no drafter: no tree to bound


def test_the_tree_rules_live_in_the_request_and_the_plan(loaded):
    """0 or at least 2 rows is the request's own rule (no pair needed); what the lattice
    holds is `plan.fit`'s, told as the request's field."""
    from dflash2_mlx.engine.plan import fit
    from dflash2_mlx.engine.request import RequestError

    target, _, drafter = loaded
    for rows, words in ((1, "tree_rows 1: use 0 for the chain or N >= 2"), (-2, "tree_rows -2 must be at least 0")):
        with pytest.raises(RequestError, match=words) as e:
            DecodeRequest(tree_rows=rows)
        assert e.value.field == "tree_rows"
    pair = Pair.make(target, drafter)
    assert fit(pair, DecodeRequest(block_size=None, tree_rows=241)) == (drafter.config.block_size, 241)
    with pytest.raises(RequestError, match="at most 241 rows") as e:
        fit(pair, DecodeRequest(tree_rows=242))
    assert e.value.field == "tree_rows"
    assert fit(Pair.make(target), DecodeRequest(tree_rows=10**6)) == (1, 0)  # no drafter: plain decoding


def test_generate_refuses_tree_100000_at_once(box, paths):
    r = box.run(["generate", *pair_args(paths), "-p", "def f(x):", "--tree", "100000", "--json"])
    line = r.one_error_line()
    assert r.code == 1 and "--tree 100,000" in line and "at most 241 rows" in line and "lattice" in line


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_chat_and_serve_refuse_tree_100000_before_any_turn(box, paths, command):
    args = [command, *pair_args(paths), "--tree", "100000"] + (["--port", "0"] if command == "serve" else [])
    r = box.run(args, input=b"hello\n/quit\n")
    lines = r.err_lines
    assert r.code == 1 and "Traceback" not in r.err, r.err
    # chat names the flag; serve's line comes from its engine service ("tree rows").
    assert lines[-1].startswith(("error: --tree 100,000", "error: tree rows 100,000")), lines[-1]
    assert "at most 241 rows" in lines[-1]
    assert not any(line.startswith("error") for line in lines[:-1])


def test_chat_set_tree_is_bounded_too(loaded):
    from dflash2_mlx.text.chat_session import ChatSession

    target, tokenizer, drafter = loaded
    session = ChatSession(Pair.make(target, drafter), tokenizer)
    with pytest.raises(DFlashError, match="^tree 100,000: .* at most 241 rows"):
        session.set("tree", "100000")
    assert session.request.tree_rows == 0
    with pytest.raises(DFlashError, match="at most 241 rows"):
        ChatSession(Pair.make(target, drafter), tokenizer, request=DecodeRequest(tree_rows=300))


# -- 4. serve --port -----------------------------------------------------------------------


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_port_out_of_range_is_a_usage_error(box, port):
    r = box.run(["serve", "--port", port])
    line = r.one_error_line()
    assert r.code == 2 and "--port" in line and "65535" in line and "dflash2 serve --help" in line


# -- 5. analyze ------------------------------------------------------------------------------


def single_file(tmp_path: Path) -> Path:
    """One small Python file whose name is outside the default 5 % held-out share."""
    from dflash2_mlx.train.setup import is_heldout

    text = Path(__file__).with_name("helpers.py").read_text()[:3000]
    for i in range(100):
        path = tmp_path / f"notes{i}.py"
        if not is_heldout(str(path), 0.05):
            path.write_text(text)
            return path
    raise AssertionError("every name held out")


def analyze_args(data: Path, out: Path, *extra) -> list[str]:
    # The tiny qwen3 pair: what is checked is the parsing and the hint, not the built-in's numbers.
    return ["analyze", "--data", str(data), "--out", str(out), "--model", str(target_folder("qwen3")),
            "--dflash2", str(drafter_folder("qwen3", "dflash2")), "--prompts", "1",
            "--max-tokens", "8", "--seq-len", "64", "--prompt-len", "16", *extra]


def test_analyze_with_one_file_says_what_helps(tmp_path):
    box = Sandbox(tmp_path / "box")
    data = single_file(tmp_path)
    r = box.run(analyze_args(data, tmp_path / "out"))
    line = r.one_error_line()
    assert "held out whole" in line and "--heldout-fraction 1" in line and "a folder or many files" in line
    assert "raise --heldout-fraction" not in line


@pytest.mark.parametrize("flags, fragment", [
    (["--block-size", "40"], "--block-size 40 is outside [2, 16]"),
    (["--block-size", "auto"], "--block-size auto does not apply to analyze"),
    (["--block-size", "x"], "--block-size 'x' must be"),
    (["--seq-len", "5000"], "--seq-len 5,000 is over this model's context of 2,048"),
    (["--prompts", "0"], "--prompts 0 must be at least 1"),
])
def test_analyze_refuses_a_bad_value_in_one_line_before_measuring(tmp_path, flags, fragment):
    box = Sandbox(tmp_path / "box")
    r = box.run(analyze_args(single_file(tmp_path), tmp_path / "out", "--heldout-fraction", "1", *flags))
    assert fragment in r.one_error_line()


def test_analyze_block_size_4_runs_on_the_file_the_hint_names(cli, tmp_path):
    """The hint followed (--heldout-fraction 1 on the one file) and --block-size 4
    parsed like every other command's: three draft positions measured."""
    out = tmp_path / "out"
    code, _, err = cli(analyze_args(single_file(tmp_path), out, "--heldout-fraction", "1", "--block-size", "4"))
    assert code == 0, err
    rec = json.loads((out / "analysis.json").read_text())["variants"]["dflash2"]
    assert len(rec["T0"]["acceptance_by_position"]) == 3 and rec["T0"]["greedy_identical_to_ar"] == "1/1"
