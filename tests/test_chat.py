"""`dflash2 chat`: turns after the first prefill only their new tokens, /reset
forgets, an interrupted answer leaves a session whose next answer equals a fresh
run over the same conversation, the commands work, and it renders without a
terminal.

The conversation is driven through `chat_loop` (the command loop the CLI runs)
with a scripted input stream; one test drives the installed `dflash2 chat`
through stdin and interrupts it with a real SIGINT.
"""

import re
import signal
import subprocess
import threading
import time

import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams
from dflash2_mlx.text.chat_session import ChatSession
from dflash2_mlx.cli import ui
from dflash2_mlx.cli.chat import chat_loop, parse_command
from dflash2_mlx.text.generate import stream_generate
from cli_process import dflash2_command
from helpers import drafter_folder, load_pair_for, target_folder

MAX_TOKENS, BLOCK = 12, 4


@pytest.fixture(scope="module")
def pair():
    return load_pair_for("qwen3", "dflash2")


def new_session(pair, **kw):
    """A session of the qwen3 pair; `kw`: its request's settings (MAX_TOKENS, block BLOCK unless given)."""
    target, tokenizer, drafter = pair
    request = DecodeRequest(**{"max_tokens": MAX_TOKENS, "block_size": BLOCK, **kw})
    return ChatSession(Pair.make(target, drafter), tokenizer, system_prompt="Be brief.", request=request)


def fresh_answer(pair, ids, drafter=True):
    """The same conversation ids decoded from scratch, no cache."""
    target, tokenizer, d = pair
    request = DecodeRequest(max_tokens=MAX_TOKENS, block_size=BLOCK if drafter else None)
    return [r.token for r in stream_generate(Pair.make(target, d if drafter else None), tokenizer, list(ids), request)]


def assert_cache_consistent(session):
    n = len(session.cache.tokens)
    assert session.cache.offset == n - 1
    if session.drafter is not None:
        assert session.cache.drafter[0].offset == n - 1


class Script:
    """A fake input stream for `chat_loop`: strings are lines, exceptions are raised."""

    def __init__(self, *lines):
        self.lines = list(lines)

    def __call__(self, prompt):
        if not self.lines:
            raise EOFError
        line = self.lines.pop(0)
        if isinstance(line, BaseException) or (isinstance(line, type) and issubclass(line, BaseException)):
            raise line
        return line


def drive(session, *lines, on_token=None):
    """Run the chat loop over `lines`; returns (turn results, printed text)."""
    results = []
    ask = session.ask

    def recording_ask(text, on_token=None):
        results.append(ask(text, on_token=on_token))
        return results[-1]

    session.ask = recording_ask
    view = ui.ChatView(ui.make_console(width=120, record=True), color=True)
    try:
        chat_loop(session, Script(*lines), view, on_token=on_token)
    finally:
        del session.ask
    return results, view.console.export_text()


# -- multi-turn caching ----------------------------------------------------------------------


def test_three_turns_prefill_only_new_tokens(pair):
    session = new_session(pair)
    results, out = drive(session, "Write a loop", "Now make it faster", "And explain it")
    assert [r.finish_reason for r in results] == ["length"] * 3
    held = 0
    for i, r in enumerate(results):
        assert r.reused_tokens == held  # everything said so far was already in the caches
        new = len(r.prompt_ids) - held
        # Only the new tokens (plus the last answer token, committed but not yet run) are prefilled.
        assert r.stats.prompt_tokens == r.prefilled_tokens == (new + 1 if i else new)
        if i:
            assert not r.rewound and r.stats.prompt_tokens < len(r.prompt_ids) / 2
        # The ids are the rendered conversation (cached answer tokens included as generated).
        tokenizer = session.tokenizer
        history = session.messages[: 2 * i]
        rendered = session.render(history + [{"role": "user", "content": session.messages[2 * i]["content"]}])
        assert tokenizer.decode(list(r.prompt_ids)) == rendered
        # Reusing the caches changes nothing: a fresh run over the same ids agrees.
        assert list(r.tokens) == fresh_answer(pair, r.prompt_ids)
        held = len(r.prompt_ids) + len(r.tokens)
    assert len(session.cache.tokens) == held
    assert_cache_consistent(session)
    assert out.count(" tok/s · prompt ") == 3 and "τ " in out and "cached" in out


def test_plain_decoding_session_caches_too(pair):
    target, tokenizer, _ = pair
    session = ChatSession(Pair.make(target), tokenizer, request=DecodeRequest(max_tokens=MAX_TOKENS, block_size=None))
    results, _ = drive(session, "Hello", "Again")
    assert results[1].reused_tokens == len(results[0].prompt_ids) + MAX_TOKENS
    assert list(results[1].tokens) == fresh_answer(pair, results[1].prompt_ids, drafter=False)
    assert_cache_consistent(session)


def test_reset_clears_the_conversation(pair):
    session = new_session(pair)
    results, out = drive(session, "Write a loop", "More", "/reset", "Write a loop")
    assert "conversation cleared" in out
    first, last = results[0], results[-1]
    assert last.reused_tokens == 0 and last.prompt_ids == first.prompt_ids
    assert last.tokens == first.tokens
    assert len(session.messages) == 2
    assert_cache_consistent(session)
    results, out = drive(session, "/clear")
    assert session.messages == [] and session.cache.tokens == [] and session.cache.offset == 0


def test_engine_contract_second_turn_stop_inside_a_block(pair):
    """What the session relies on: a continuing call records its prompt's first
    token (the last one cached) once, and a stop inside a verified block on a
    later turn rewinds the caches to exactly the tokens returned."""
    from dflash2_mlx.engine.decode.loop import DecodeCache

    target, tokenizer, drafter = pair
    cache = DecodeCache(target.make_cache(), drafter.make_cache())
    pair = Pair.make(target, drafter)
    first = [r.token for r in stream_generate(pair, tokenizer, [5, 9, 13, 2],
                                              DecodeRequest(max_tokens=10, block_size=None), prompt_cache=cache)]
    turn2 = [first[-1], 40, 41, 42]
    full = [r.token for r in stream_generate(pair, tokenizer, [5, 9, 13, 2] + first + turn2[1:],
                                             DecodeRequest(max_tokens=30, block_size=None))]
    stop = tokenizer.decode(full[5:7])
    out = [r.token for r in stream_generate(pair, tokenizer, turn2,
                                            DecodeRequest(max_tokens=30, block_size=None, stop=[stop]), prompt_cache=cache)]
    assert out == full[: len(out)] and len(out) < 30
    assert cache.tokens == [5, 9, 13, 2] + first + turn2[1:] + out
    assert cache.offset == cache.drafter_rows == len(cache.tokens) - 1


# -- interruption ------------------------------------------------------------------------------


def test_ctrl_c_during_an_answer_keeps_the_session_consistent(pair):
    session = new_session(pair)
    seen = []

    def interrupt_second_turn(r):
        seen.append(r.token)
        if len(seen) == MAX_TOKENS + 5:  # the 5th token of the second answer
            raise KeyboardInterrupt

    results, out = drive(session, "Write a loop", "Now make it faster", "And explain it",
                         on_token=interrupt_second_turn)
    first, cut, third = results
    assert cut.interrupted and len(cut.tokens) == 5 and cut.stats is None
    assert "interrupted" in out
    # The partial answer is part of the conversation, and of the caches.
    assert session.messages[3]["content"] == session.tokenizer.decode(list(cut.tokens))
    assert third.reused_tokens == len(cut.prompt_ids) + 5 and not third.rewound
    assert list(third.tokens) == fresh_answer(pair, third.prompt_ids)
    assert_cache_consistent(session)


def test_interrupt_inside_a_verify_forward_is_repaired(pair):
    """A real Ctrl-C can land mid-forward (caches holding rows past the last
    committed token); the session trims them and the next answer is unaffected."""
    session = new_session(pair)
    session.ask("Write a loop")
    target = session.target
    calls = []
    real_call = type(target)._forward  # every target forward goes through it

    def flaky(self, tokens, cache, *a, **kw):
        out = real_call(self, tokens, cache, *a, **kw)
        calls.append(tokens.shape[1])
        if len(calls) == 3:  # the second verify of this answer, after its rows went in
            raise KeyboardInterrupt
        return out

    type(target)._forward = flaky
    try:
        cut = session.ask("Now make it faster")
    finally:
        type(target)._forward = real_call
    assert cut.interrupted and 0 < len(cut.tokens) < MAX_TOKENS
    assert_cache_consistent(session)
    nxt = session.ask("And explain it")
    assert nxt.reused_tokens == len(cut.prompt_ids) + len(cut.tokens)
    assert list(nxt.tokens) == fresh_answer(pair, nxt.prompt_ids)


def test_interrupt_before_the_first_token_forgets_the_question(pair):
    session = new_session(pair)
    session.ask("Write a loop")
    messages, tokens = list(session.messages), list(session.cache.tokens)
    target = session.target
    real_call = type(target)._forward  # every target forward goes through it

    def boom(self, tokens_, cache, *a, **kw):
        real_call(self, tokens_, cache, *a, **kw)  # the prefill rows go in, then Ctrl-C
        raise KeyboardInterrupt

    type(target)._forward = boom
    try:
        cut = session.ask("Now make it faster")
    finally:
        type(target)._forward = real_call
    assert cut.interrupted and cut.tokens == ()
    assert session.messages == messages and session.cache.tokens == tokens
    assert_cache_consistent(session)


@pytest.mark.parametrize("family", ["qwen3_5", "muse_glimmer"])
def test_hybrid_and_sliding_window_targets(family):
    """Recurrent (Gated DeltaNet) and sliding-window targets: turns reuse the
    caches, and after an interruption that recurrent state cannot rewind to,
    the next turn re-reads the conversation and still answers as a fresh run."""
    pair = load_pair_for(family, "dflash2")
    session = new_session(pair)
    seen = []

    def interrupt(r):
        seen.append(r)
        if len(seen) == MAX_TOKENS + 3:
            raise KeyboardInterrupt

    results, _ = drive(session, "Write a loop", "Now make it faster", "And explain it", on_token=interrupt)
    first, cut, third = results
    assert cut.interrupted and cut.reused_tokens == len(first.prompt_ids) + MAX_TOKENS
    for r in (cut, third):
        if r.tokens and not r.interrupted:
            assert list(r.tokens) == fresh_answer(pair, r.prompt_ids)
    assert third.reused_tokens in (0, len(cut.prompt_ids) + len(cut.tokens))
    assert_cache_consistent(session)


# -- templates that re-render history ----------------------------------------------------------


class ForgetfulTemplateSession(ChatSession):
    """Renders earlier answers differently from how they were generated (as Qwen3
    does when it drops <think> blocks): the cache must not be trusted past that."""

    def render(self, messages):
        edited = [dict(m, content="(earlier answer)") if m["role"] == "assistant" else m for m in messages]
        return super().render(edited)


def test_template_that_rerenders_history_falls_back_to_rewinding(pair):
    target, tokenizer, drafter = pair
    session = ForgetfulTemplateSession(Pair.make(target, drafter), tokenizer,
                                       request=DecodeRequest(max_tokens=MAX_TOKENS, block_size=BLOCK))
    first = session.ask("Write a loop")
    second = session.ask("Now make it faster")
    assert second.rewound and 0 < second.reused_tokens < len(first.prompt_ids) + len(first.tokens)
    assert second.prefilled_tokens == len(second.prompt_ids) - second.reused_tokens + 1
    assert tokenizer.decode(list(second.prompt_ids)) == session.render(
        session.messages[:2] + [{"role": "user", "content": "Now make it faster"}])
    assert list(second.tokens) == fresh_answer(pair, second.prompt_ids)
    assert_cache_consistent(session)


# -- commands ------------------------------------------------------------------------------------


def test_parse_command():
    assert parse_command("hello /there").name == ""
    for line, name in [("/help", "help"), ("/?", "help"), ("/reset", "reset"), ("/clear", "reset"),
                       ("/quit", "quit"), ("q", "quit"), ("/bye", "quit"), ("/exit", "quit"),
                       ("/stats", "stats"), ("/color", "color"), ("/set temp 0.5", "set"),
                       ("/system Be kind.", "system"), ("/bogus", "unknown")]:
        assert parse_command(line).name == name, line
    assert parse_command("/set temp 0.5").arg == "temp 0.5"
    assert parse_command("/system  Be kind. ").arg == "Be kind."


def test_commands_through_the_loop(pair):
    # Seeded: "/set temp 0.7" samples, and an unseeded draw (from MLX's global generator, where
    # the tests before this one left it) can end the answer early on EOS.
    session = new_session(pair, sampling=SamplingParams(seed=0))
    results, out = drive(
        session, "/help", "/set temp 0.7", "/set top_p 0.9", "/set max_tokens 6", "/set block_size 3",
        "/set block_size 99", "/set temp -1", "/set nonsense 1", "/set temp", "/set", "/bogus",
        "/system Answer in French.", "/system", "hi", "/stats", "/color", "/quit", "never read")
    assert "/reset, /clear" in out and "/set NAME VALUE" in out  # help
    r = session.request
    assert (r.sampling.temperature, r.sampling.top_p, r.max_tokens, r.block_size) == (0.7, 0.9, 6, 3)
    for fragment in ("block_size 99 is outside [2, 16]", "temperature -1.0 is negative", "unknown setting 'nonsense'",
                     "/set temp needs a value", "unknown command /bogus"):
        assert f"error: {fragment}" in out, fragment
    assert "max_tokens 6 · block_size 3" in out  # /set with no name shows everything
    assert "'Answer in French.'" in out
    assert len(results) == 1 and len(results[0].tokens) == 6  # "never read" was after /quit
    assert session.tokenizer.decode(list(results[0].prompt_ids)).startswith(
        "<|im_start|>system\nAnswer in French.<|im_end|>")
    assert "pos  1" in out and "draft acceptance" in out  # /stats
    assert "not coloured" in out and out.rstrip().endswith("bye")


def test_multiline_input_and_ctrl_c_at_the_prompt(pair):
    session = new_session(pair)
    results, out = drive(session, '"""first line', "second line", 'third"""', KeyboardInterrupt, "hello",
                         KeyboardInterrupt, KeyboardInterrupt, "never read")
    assert results[0].prompt_ids and session.messages[0]["content"] == "first line\nsecond line\nthird"
    assert session.messages[2]["content"] == "hello"
    assert "Ctrl-C again" in out and out.rstrip().endswith("bye")
    results, out = drive(session, '"""one line"""')
    assert session.messages[-2]["content"] == "one line"


def test_system_prompt_change_rereads_the_conversation(pair):
    session = new_session(pair)
    first = session.ask("Write a loop")
    session.set_system_prompt("Answer in French.")
    second = session.ask("More")
    assert second.rewound and second.reused_tokens < len(first.prompt_ids)
    assert list(second.tokens) == fresh_answer(pair, second.prompt_ids)


# -- rendering without a terminal ----------------------------------------------------------------


def render(renderable, width=120):
    console = ui.make_console(width=width, record=True)
    console.print(renderable)
    return console.export_text()


def test_turn_line_and_stats_render_from_state(pair):
    session = new_session(pair)
    r = session.ask("Write a loop")
    line = render(ui.turn_line(r))
    assert f"{MAX_TOKENS} tokens · " in line and " tok/s · prompt " in line
    assert f"({r.prefilled_tokens} new, 0 cached)" in line
    assert f"τ {r.stats.mean_acceptance_length:.2f}" in line and "peak " in line
    stats = render(ui.turn_stats(r))
    assert "DFlash 2, block 4" in stats and stats.count("pos ") == BLOCK - 1
    assert "no answer yet" in render(ui.turn_stats(None))


def test_drafted_tokens_are_coloured_only_when_asked():
    console = ui.make_console(width=80, color=True)
    view = ui.ChatView(console, color=True)
    view.token("drafted", True)
    view.token("plain", False)
    coloured = console.file.getvalue()
    assert "\x1b[36mdrafted" in coloured and "\x1b[36mplain" not in coloured
    console = ui.make_console(width=80, color=True)
    view = ui.ChatView(console, color=False)
    view.token("drafted", True)
    assert "\x1b[36m" not in console.file.getvalue()


# -- the command line -----------------------------------------------------------------------------


def test_help(cli):
    code, out, _ = cli(["chat", "--help"])
    assert code == 0 and "conversation stays in the" in out
    for flag in ("--model", "--drafter", "--max-tokens", "--temp", "--top-p", "--top-k", "--seed", "--block-size",
                 "--system-prompt", "--chat-template-config", "--ar", "--color", "--no-color", "--draft-quant"):
        assert flag in out, flag


@pytest.mark.parametrize("argv, code, fragment", [
    (["--bogus"], 2, "--bogus"),
    (["--max-tokens", "ten"], 2, "max-tokens"),
    (["--model", "/nonexistent/target"], 1, "does not exist"),
    (["--drafter", "./no/such/drafter"], 1, "does not exist"),
    (["--temp", "-1"], 1, "negative"),
    (["--block-size", "1"], 1, "--block-size 1"),
    (["--chat-template-config", "{nope"], 1, "JSON"),
])
def test_bad_flags_are_one_line_errors(cli, argv, code, fragment):
    base = ["chat", "--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2")]
    got, out, err = cli(base + argv)
    assert got == code, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and fragment in lines[-1] and "Traceback" not in err
    assert all(not line.startswith("error") for line in lines[:-1])


def test_entry_point_over_stdin_with_a_real_sigint():
    """The installed command, driven through a pipe: a long answer is stopped by
    SIGINT, the chat carries on, and the next turn still reuses the cache."""
    proc = subprocess.Popen(
        [*dflash2_command(), "chat", "--model", str(target_folder("qwen3")), "--drafter",
         str(drafter_folder("qwen3", "dflash2")), "-m", "100000", "--block-size", "4", "--no-color"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()
    try:
        proc.stdin.write("Write a very long story\n")
        proc.stdin.flush()
        deadline = time.time() + 60
        while time.time() < deadline and "".join(chunks).count(">>> ") < 1:
            time.sleep(0.05)
        start = len("".join(chunks))
        while time.time() < deadline and len("".join(chunks)) < start + 40:  # the answer is streaming
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        deadline = time.time() + 30
        while time.time() < deadline and "interrupted" not in "".join(chunks):
            time.sleep(0.05)
        proc.stdin.write("/set max_tokens 5\nAnd now?\n/quit\n")
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=5)
    out, err = "".join(chunks), proc.stderr.read()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "error" not in out
    assert "interrupted" in out and "max_tokens = 5" in out
    assert "5 tokens · " in out and " cached)" in out and out.rstrip().endswith("bye")
    # The second turn's line: exactly 5 tokens (not the first turn's 15, 25, 45 …).
    second = [line for line in out.splitlines() if re.search(r"(?<!\d)5 tokens · ", line)][0]
    assert ", 0 cached)" not in second  # the second turn reused the first one's caches
