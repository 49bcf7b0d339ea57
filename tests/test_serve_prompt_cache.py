"""The prompt cache through a real `dflash2 serve` on the built-in pair: the
same text from memory and from disk after a restart, a shared system prompt,
an edited turn, and bad cache files (docs/prompt-cache.md)."""

import hashlib
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from serve_helpers import Server

pytestmark = pytest.mark.slow

ARGS = ("--block-size", "4", "--max-tokens", "6")
# 1,537 prompt tokens on the built-in tokenizer and chat template: six whole
# blocks of 256 and one token (so a hit leaves one token to run); about 1,075
# of system prompt, so blocks 0-3 hold only the system prompt.
SYSTEM = " ".join(f"Rule {i}: answer briefly and cite line {i * 7}." for i in range(58))
QUESTION = " ".join(f"Step {i}: add {i} to the total." for i in range(39)) + " ok ok"
OTHER = "What is the total after every step?"


def ask(server: Server, system: str, user: str) -> tuple[str, dict]:
    body = {"model": "builtin", "temperature": 0, "max_tokens": 6,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()
    return data["choices"][0]["message"]["content"], data["usage"]


def cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def disk_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("prompt-cache")


@pytest.fixture(scope="module")
def first(tmp_path_factory, folder):
    """A server over an empty --cache-dir: the cold answers, then a memory hit."""
    server = Server(*ARGS, "--cache-dir", str(folder), tmp=tmp_path_factory.mktemp("a"))
    try:
        cold = ask(server, SYSTEM, QUESTION)
        short = ask(server, "Be brief.", QUESTION[:700])
        warm = ask(server, SYSTEM, QUESTION)
    finally:
        code, log = server.stop()
    assert code == 0 and "Traceback" not in log, log
    return cold, short, warm


def test_memory_hit_gives_the_same_text(first):
    (text, usage), _, (warm, warm_usage) = first
    assert usage["prompt_tokens"] == 1537 and cached(usage) == 0
    assert warm == text and cached(warm_usage) == 1536
    assert warm_usage["dflash2_prompt_cache"]["disk_tokens"] == 0


ORPHAN = ".tmp-999999-" + "0" * 64 + ".safetensors"  # as a writer killed mid-write leaves it


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, folder, first):
    (folder / ORPHAN).write_bytes(b"half a file")
    # Memory off: every hit below is read from disk.
    server = Server(*ARGS, "--cache-dir", str(folder), "--cache-bytes", "0", tmp=tmp_path_factory.mktemp("b"))
    yield server
    code, log = server.stop()
    assert code == 0 and "Traceback" not in log, log


def test_restart_reads_the_prefix_from_disk(first, folder, restarted):
    (text, usage), _, _ = first
    assert not (folder / ORPHAN).exists()  # a dead writer's temporary file: removed, never read
    again, u = ask(restarted, SYSTEM, QUESTION)
    assert again == text
    assert cached(u) == 1536 and u["dflash2_prompt_cache"]["disk_tokens"] == 1536
    assert restarted.metric('dflash2_prompt_cache_tier_hits_total{tier="disk"}') == 6
    # Anthropic counts the same cache reads (memory off: from disk again).
    body = {"model": "builtin", "max_tokens": 6, "temperature": 0, "system": SYSTEM,
            "messages": [{"role": "user", "content": QUESTION}]}
    r = httpx.post(restarted.url + "/v1/messages", json=body, timeout=300).json()
    assert r["content"][0]["text"] == text
    assert r["usage"]["cache_read_input_tokens"] == 1536 == r["usage"]["dflash2_prompt_cache"]["disk_tokens"]


def test_a_second_conversation_reuses_the_system_prompt(restarted):
    _, u = ask(restarted, SYSTEM, OTHER)
    assert cached(u) == 1024 and u["prompt_tokens"] < 1200  # the system prompt's whole blocks


def test_an_edited_turn_reuses_up_to_the_edit_and_the_first_branch_stays(first, restarted):
    (text, _), _, _ = first
    edited = QUESTION.replace("Step 30:", "Step thirty:")  # inside block 5
    _, u = ask(restarted, SYSTEM, edited)
    assert cached(u) == 1280
    again, u = ask(restarted, SYSTEM, QUESTION)
    assert again == text and cached(u) == 1536


def test_bad_cache_files_are_skipped_with_one_line_each(first, folder, restarted):
    """The last block of the prompt turned foreign, then corrupt, then
    truncated while the server runs (memory off: every request reads the
    disk): each is skipped in one line and rebuilt; every answer is the cold one."""
    (text, _), _, _ = first
    chain = chain_files(folder)
    last = chain[5]
    faults = [lambda: last.write_bytes(chain[4].read_bytes()),  # foreign: another block's file
              lambda: last.write_bytes(flip(last.read_bytes())),  # corrupt
              lambda: last.write_bytes(last.read_bytes()[:1000])]  # truncated
    for fault in faults:
        wait_for(last)  # rewritten after the answer before
        fault()
        again, u = ask(restarted, SYSTEM, QUESTION)
        assert again == text and cached(u) == 1280
    skipped = [line for line in restarted.output().splitlines() if "prompt cache:" in line]
    assert len(skipped) == 3 and all(last.name in line for line in skipped), skipped
    wait_for(last)
    again, u = ask(restarted, SYSTEM, QUESTION)
    assert again == text and cached(u) == 1536 and restarted.metric("dflash2_prompt_cache_disk_skipped_total") == 3


def flip(data: bytes) -> bytes:
    data = bytearray(data)
    data[-3] ^= 0xFF
    return bytes(data)


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists()


def chain_files(folder: Path) -> dict[int, Path]:
    """The block files of SYSTEM + QUESTION by position (0: the first block),
    found by following the key chain through the files' headers; block 5 is
    the one whose text holds "Step 30:" (the edited branch's does not)."""
    import mlx.core as mx
    from tokenizers import Tokenizer

    import dflash2_mlx.builtin

    tokens = {}
    for path in disk_files(folder):
        _, meta = mx.load(str(path), return_metadata=True)
        tokens[path.name[: -len(".safetensors")]] = np.array(json.loads(meta["tokens"]), dtype=np.int64)
    parent = {c: p for c, ids in tokens.items() for p in tokens
              if hashlib.sha256(p.encode() + ids.tobytes()).hexdigest() == c}
    depth = {}
    for key in tokens:
        k, d = key, 0
        while k in parent:
            k, d = parent[k], d + 1
        depth.setdefault(d, []).append(key)
    tokenizer = Tokenizer.from_file(str(next(Path(dflash2_mlx.builtin.__file__).parent.rglob("tokenizer.json"))))
    chain = {5: next(k for k in depth[5] if "Step 30:" in tokenizer.decode(tokens[k].tolist()))}
    for d in (4, 3, 2, 1, 0):
        chain[d] = parent[chain[d + 1]]
    return {d: folder / f"{k}.safetensors" for d, k in chain.items()}


def test_a_full_disk_budget_is_one_line_and_the_answer_is_unchanged(tmp_path_factory, first):
    _, (text, _), _ = first
    folder = tmp_path_factory.mktemp("tiny")
    server = Server(*ARGS, "--cache-dir", str(folder), "--cache-disk-bytes", "1000", tmp=tmp_path_factory.mktemp("d"))
    try:
        answers = [ask(server, "Be brief.", QUESTION[:700])[0] for _ in range(2)]
    finally:
        code, log = server.stop()
    assert code == 0 and answers == [text, text]
    lines = [line for line in log.splitlines() if "--cache-disk-bytes" in line]
    assert len(lines) == 1 and not disk_files(folder), log


def test_blocks_reach_the_disk_while_the_batch_keeps_running(tmp_path_factory, first):
    """Under steady load the batch never empties: a long answer (EOS banned)
    keeps running while a shorter prompt joins, runs and finishes; its block
    files are written while the long answer still runs, not when the server
    next goes idle (the writer has its own thread)."""
    import threading

    _, (text, _), _ = first
    folder = tmp_path_factory.mktemp("busy")
    server = Server(*ARGS, "--max-batch", "2", "--cache-dir", str(folder), tmp=tmp_path_factory.mktemp("e"))
    started, done, leave = threading.Event(), threading.Event(), threading.Event()

    def long_answer():
        body = {"model": "builtin", "temperature": 0, "max_tokens": 1500, "stream": True, "logit_bias": {"0": -100},
                "messages": [{"role": "user", "content": "Write a long Python module."}]}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                started.set()
                if leave.is_set():
                    return  # the client goes away: the server cancels the answer
                if line == "data: [DONE]":
                    break
        done.set()

    reader = threading.Thread(target=long_answer, daemon=True)
    reader.start()
    try:
        assert started.wait(120)
        again, usage = ask(server, "Be brief.", QUESTION[:700])
        assert again == text and cached(usage) == 0
        whole = (usage["prompt_tokens"] - 1) // 256  # its whole blocks (the last token is never in one)
        deadline = time.monotonic() + 60
        while len(disk_files(folder)) < whole and time.monotonic() < deadline and not done.is_set():
            time.sleep(0.05)
        running = httpx.get(server.url + "/v1/dflash/state", timeout=10).json()["queue"]["running"]
        assert whole >= 1 and len(disk_files(folder)) >= whole and not done.is_set() and running == 1
    finally:
        leave.set()
        reader.join(timeout=120)
        code, log = server.stop()
    assert code == 0 and "Traceback" not in log, log
