"""The prompt cache in blocks (text/prompt_cache): the same tokens with and
without each tier at T=0 for plain, recurrent (qwen3_5) and window
(muse_glimmer) targets; shared prefixes stored once; branches; disk faults."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.loading.checkpoints import load_target
from dflash2_mlx.text.generate import stream_generate
from dflash2_mlx.text.prompt_cache import CacheSettings, PromptCache
from dflash2_mlx.text.prompt_cache.keys import block_keys
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, write_target

S = 16  # block tokens: small, so short prompts span several blocks
LOOKALIKES = {"qwen3": {}, "qwen3_5": {}, "muse_glimmer": dict(tie_word_embeddings=False, sliding_window=8)}


def block4(n: int) -> DecodeRequest:
    """A request of `n` tokens drafted in blocks of 4, as these tests run them."""
    return DecodeRequest(max_tokens=n, block_size=4)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    out = {}
    for family, extra in LOOKALIKES.items():
        folder = tmp_path_factory.mktemp(family)
        write_target(folder, family, **extra)
        target, tokenizer = load_target(str(folder))
        config = json.loads((folder / "config.json").read_text())
        drafter = random_drafter(drafter_config_dict(config, "dflash2", block_size=8), seed=1)
        out[family] = (Pair.make(target, drafter), tokenizer)
    return out


def answer(pair, tokenizer, ids, pcache=None, n=8):
    """One request as the server runs it: (tokens, reuse)."""
    if pcache is None:
        return [r.token for r in stream_generate(pair, tokenizer, ids, block4(n))], None
    cache, prompt, reuse = pcache.prepare(ids)
    out = [r.token for r in stream_generate(pair, tokenizer, prompt, block4(n), prompt_cache=cache)]
    pcache.put(cache)
    pcache.flush()
    return out, reuse


SYSTEM = [(7 * i + 3) % 200 + 5 for i in range(70)]  # 4 whole blocks and a bit


@pytest.mark.parametrize("family", list(LOOKALIKES))
def test_same_tokens_with_and_without_each_tier(pairs, family, tmp_path):
    pair, tok = pairs[family]
    asks = [SYSTEM + [11, 12, 13], SYSTEM + [21, 22], SYSTEM[:40] + [31, 32, 33, 34]]
    cold = [answer(pair, tok, ids)[0] for ids in asks]
    # Snapshots (qwen3_5, muse_glimmer) every 2 blocks: thinned, and the branch below still ends at one.
    memory = PromptCache(pair, CacheSettings(block_tokens=S, snapshot_every=2))
    got = [answer(pair, tok, ids, memory) for ids in asks]
    assert [g[0] for g in got] == cold
    assert got[1][1].tokens >= 64 and got[1][1].disk == 0  # the shared system prompt, from memory
    assert got[2][1].tokens >= 32  # a branch reuses the blocks before the edit
    # Disk only (no memory tier), then a restart: a new cache over the same folder.
    disk = CacheSettings(block_tokens=S, memory_bytes=0, folder=tmp_path, snapshot_every=2)
    first = [answer(pair, tok, ids, PromptCache(pair, disk)) for ids in asks]
    assert [g[0] for g in first] == cold
    again = [answer(pair, tok, ids, PromptCache(pair, disk)) for ids in asks]
    assert [g[0] for g in again] == cold
    assert all(g[1].disk >= 32 and g[1].disk == g[1].tokens for g in again)


def test_a_shared_prefix_is_stored_once_and_both_branches_stay(pairs):
    pair, tok = pairs["qwen3"]
    pcache = PromptCache(pair, CacheSettings(block_tokens=S))
    answer(pair, tok, SYSTEM + [1, 2, 3], pcache)
    blocks = len(pcache._blocks)
    answer(pair, tok, SYSTEM + [4, 5, 6], pcache)
    # The second conversation adds only the blocks past the shared prefix (its answer's).
    assert len(pcache._blocks) - blocks <= 1
    edited = SYSTEM[:50] + [99] + SYSTEM[51:]
    _, reuse = answer(pair, tok, edited, pcache)
    assert reuse.tokens >= 48  # up to the edit (a conversation tail reaches it token by token)
    _, reuse = answer(pair, tok, SYSTEM + [7], pcache)
    assert reuse.tokens == 64  # the first branch is still held


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fault", ["corrupt", "truncated", "foreign"])
def test_a_bad_file_is_skipped_with_one_line(pairs, tmp_path, fault):
    pair, tok = pairs["qwen3"]
    settings = CacheSettings(block_tokens=S, memory_bytes=0, folder=tmp_path)
    cold, _ = answer(pair, tok, SYSTEM + [5])
    pcache = PromptCache(pair, settings)
    answer(pair, tok, SYSTEM + [5], pcache)
    files = [tmp_path / f"{key}.safetensors" for key in block_keys(pcache.fingerprint, SYSTEM, S)]
    victim = files[1]  # the second block: the first stays usable
    if fault == "corrupt":
        corrupt(victim)
    elif fault == "truncated":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    else:
        os.replace(files[2], victim)  # another block's file under this block's name
    lines = []
    out, reuse = answer(pair, tok, SYSTEM + [5], PromptCache(pair, settings, warn=lines.append))
    assert out == cold and reuse.tokens == S and len(lines) == 1 and victim.name in lines[0]


def test_a_full_disk_budget_says_so_once(pairs, tmp_path):
    pair, tok = pairs["qwen3"]
    cold, _ = answer(pair, tok, SYSTEM + [5])
    lines = []
    pcache = PromptCache(pair, CacheSettings(block_tokens=S, folder=tmp_path, disk_bytes=1000), warn=lines.append)
    for _ in range(2):
        assert answer(pair, tok, SYSTEM + [5], pcache)[0] == cold
    assert len(lines) == 1 and "--cache-disk-bytes" in lines[0]
    assert not list(tmp_path.glob("*.safetensors"))


def test_disk_budget_evicts_least_recently_used(pairs, tmp_path):
    pair, tok = pairs["qwen3"]
    settings = CacheSettings(block_tokens=S, folder=tmp_path, memory_bytes=0)
    answer(pair, tok, SYSTEM + [5], PromptCache(pair, settings))
    one = max(f.stat().st_size for f in tmp_path.glob("*.safetensors"))
    small = CacheSettings(block_tokens=S, folder=tmp_path, memory_bytes=0, disk_bytes=3 * one)
    pcache = PromptCache(pair, small)
    answer(pair, tok, [150 + i for i in range(40)], pcache)
    assert pcache.disk.nbytes <= 3 * one and len(list(tmp_path.glob("*.safetensors"))) <= 3


WRITER = """
import sys, mlx.core as mx
from dflash2_mlx.text.prompt_cache.disk import DiskTier
disk = DiskTier(sys.argv[1], 1 << 40, "f" * 64, print)
part = [{"kind": "rows", "class": "KVCache", "keys": mx.ones((1, 32, 4096, 64)), "values": mx.ones((1, 32, 4096, 64))}]
mx.eval(part[0]["keys"], part[0]["values"])
for i in range(1000):
    disk.save(f"{i:064x}", [1, 2], part)
"""


def test_a_kill_during_a_write_leaves_nothing_that_is_read(pairs, tmp_path):
    for _ in range(3):  # a kill that lands between two writes is tried again
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)])
        try:
            deadline = time.time() + 60
            while not list(tmp_path.glob(".tmp-*")) and time.time() < deadline:
                time.sleep(0.005)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.wait()
        if list(tmp_path.glob(".tmp-*")):
            break
    assert list(tmp_path.glob(".tmp-*")), "the writer was not caught mid-write"
    pair, tok = pairs["qwen3"]
    lines = []
    settings = CacheSettings(block_tokens=S, folder=tmp_path, memory_bytes=0)
    cold, _ = answer(pair, tok, SYSTEM + [5])
    pcache = PromptCache(pair, settings, warn=lines.append)
    assert not list(tmp_path.glob(".tmp-*"))  # the dead writer's temporary file is gone
    assert answer(pair, tok, SYSTEM + [5], pcache)[0] == cold and lines == []


def test_chat_resumes_a_conversation_from_disk(pairs, tmp_path):
    """`chat --cache-dir`: a new session (as after a restart) whose conversation
    starts like an earlier one reads its blocks from disk, and answers alike."""
    from dflash2_mlx.text.chat_session import ChatSession

    pair, tok = pairs["qwen3_5"]
    system = " ".join(f"rule {i} says keep it short" for i in range(12))
    settings = CacheSettings(block_tokens=S, memory_bytes=0, folder=tmp_path)

    def session():
        return ChatSession(pair, tok, system_prompt=system, request=block4(6),
                           prompt_cache=PromptCache(pair, settings))

    one = session()
    first = one.ask("hello there")
    one.close()  # the end of a chat: its queued blocks reach the disk
    second = session()
    again = second.ask("hello there")
    assert again.tokens == first.tokens and first.disk_tokens == 0
    assert again.disk_tokens >= 2 * S and again.reused_tokens == again.disk_tokens
    assert second.ask("and then?").tokens  # the conversation goes on from the restored caches


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_a_cache_dir_that_is_a_file_is_one_line(cli, tmp_path, command):
    path = tmp_path / "file"
    path.write_text("x")
    code, out, err = cli([command, "--cache-dir", path])
    assert code != 0 and "--cache-dir" in err and "is a file" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_chat_progress_counts_the_blocks_and_the_rest_as_one_prompt(pairs, tmp_path):
    from dflash2_mlx.text.chat_session import ChatSession

    pair, tok = pairs["qwen3"]
    system = " ".join(f"rule {i} says keep it short" for i in range(12))
    session = ChatSession(pair, tok, system_prompt=system, request=block4(3),
                          prompt_cache=PromptCache(pair, CacheSettings(block_tokens=S, folder=tmp_path)))
    seen = []
    turn = session.ask("hello there", prompt_progress_callback=lambda done, total: seen.append((done, total)))
    totals = {total for _, total in seen}
    assert len(totals) == 1 and seen[-1][0] == seen[-1][1] == len(turn.prompt_ids)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[0][0] > 0  # blocks first, then the rest


# -- the disk writer's thread ---------------------------------------------------------

def test_blocks_are_written_off_the_calling_thread_and_read_while_queued(pairs, tmp_path):
    """With the writer held up (its lock taken here), `put` returns with no
    block file written; the queued blocks still hit (memory is off); after
    `flush` every file is there and a restart reads them."""
    pair, tok = pairs["qwen3"]
    settings = CacheSettings(block_tokens=S, memory_bytes=0, folder=tmp_path)
    cold, _ = answer(pair, tok, SYSTEM + [5])
    pcache = PromptCache(pair, settings)
    with pcache.disk._lock:  # the writer waits for it before renaming a file into place
        cache, prompt, _ = pcache.prepare(SYSTEM + [5])
        out = [r.token for r in stream_generate(pair, tok, prompt, block4(8), prompt_cache=cache)]
        pcache.put(cache)
        assert out == cold and not block_files(tmp_path) and pcache.pending
        again, reuse = answer_unflushed(pair, tok, SYSTEM + [5], pcache)
        assert again == cold and reuse.tokens == 64 and reuse.disk == 0  # from the queue, not a half file
    pcache.flush()
    keys = block_keys(pcache.fingerprint, SYSTEM, S)
    assert all((tmp_path / f"{key}.safetensors").exists() for key in keys) and not pcache.pending
    out, reuse = answer(pair, tok, SYSTEM + [5], PromptCache(pair, settings))
    assert out == cold and reuse.disk == 64


def block_files(folder):
    return [p for p in folder.glob("*.safetensors") if not p.name.startswith(".tmp-")]


def answer_unflushed(pair, tokenizer, ids, pcache, n=8):
    cache, prompt, reuse = pcache.prepare(ids)
    out = [r.token for r in stream_generate(pair, tokenizer, prompt, block4(n), prompt_cache=cache)]
    pcache.put(cache)
    return out, reuse


def test_a_folder_that_fails_every_write_is_one_line(pairs, tmp_path):
    pair, tok = pairs["qwen3"]
    folder = tmp_path / "cache"
    lines = []
    pcache = PromptCache(pair, CacheSettings(block_tokens=S, folder=folder), warn=lines.append)
    folder.rmdir()
    folder.write_text("not a folder any more")  # every write fails (ENOTDIR), as a full or read-only disk would
    asks = [SYSTEM + [5], [150 + i for i in range(40)], SYSTEM[:20] + [9]]
    for ids in asks:
        assert answer(pair, tok, ids, pcache)[0] == answer(pair, tok, ids)[0]
    pcache.close()
    assert len(lines) == 1 and "cannot write" in lines[0] and str(folder) in lines[0], lines
    assert pcache.stats()["disk_writes"] == 0 and not pcache.pending


# -- snapshot thinning (recurrent and window layers) ----------------------------------

PROMPT = SYSTEM + [(11 * i + 5) % 200 + 5 for i in range(45)]  # 115 ids: 7 whole blocks before the last


@pytest.mark.parametrize("family", ["qwen3_5", "muse_glimmer"])
def test_thinned_snapshots_give_the_same_tokens_in_fewer_bytes(pairs, family, tmp_path):
    pair, tok = pairs[family]
    full = PromptCache(pair, CacheSettings(block_tokens=S, snapshot_every=1))
    thin = PromptCache(pair, CacheSettings(block_tokens=S, snapshot_every=3, folder=tmp_path))
    cold = answer(pair, tok, PROMPT)[0]
    assert answer(pair, tok, PROMPT, full)[0] == cold == answer(pair, tok, PROMPT, thin)[0]
    snaps = {name: sorted(k for k in c._blocks if k.endswith("-snapshot")) for name, c in [("full", full), ("thin", thin)]}
    keys = block_keys(thin.fingerprint, PROMPT[:-1], S)
    # Blocks 3 and 6 (every third) and 7, the prompt's end; the rows of all seven blocks.
    assert snaps["thin"] == sorted(f"{keys[k]}-snapshot" for k in (2, 5, 6)) and len(snaps["full"]) == 7
    one_snapshot = full._blocks[snaps["full"][0]].nbytes
    assert thin.block_bytes == full.block_bytes - 4 * one_snapshot
    assert len(list(tmp_path.glob("*-snapshot.safetensors"))) == 3
    # The next turn resumes at the prompt's end (its snapshot is always kept).
    longer = PROMPT[:113] + [7, 8, 9]  # past the blocks, short of the conversation tail
    out, reuse = answer(pair, tok, longer, thin)
    assert out == answer(pair, tok, longer)[0] and reuse.tokens == 7 * S


@pytest.mark.parametrize("family", ["qwen3_5", "muse_glimmer"])
def test_an_edit_in_a_thinned_stretch_resumes_at_the_snapshot_before_it(pairs, family, tmp_path):
    """Snapshots after blocks 3 and 6 (and 7): an edit inside block 5 resumes
    after block 3 (48 tokens), from memory and from disk after a restart, and
    runs blocks 4 and 5 again; the first branch stays whole."""
    pair, tok = pairs[family]
    settings = CacheSettings(block_tokens=S, snapshot_every=3, folder=tmp_path)
    pcache = PromptCache(pair, settings)
    answer(pair, tok, PROMPT, pcache)
    edited = PROMPT[:70] + [99] + PROMPT[71:]
    out, reuse = answer(pair, tok, edited, pcache)
    assert out == answer(pair, tok, edited)[0] and reuse.tokens == 3 * S
    restarted = PromptCache(pair, replace(settings, memory_bytes=0))
    out, reuse = answer(pair, tok, edited, restarted)
    assert out == answer(pair, tok, edited)[0] and reuse.tokens == reuse.disk == 7 * S  # its own end snapshot
    out, reuse = answer(pair, tok, PROMPT, restarted)
    assert out == answer(pair, tok, PROMPT)[0] and reuse.disk == 7 * S


def test_cache_snapshot_every_below_one_is_one_line(cli):
    code, out, err = cli(["serve", "--cache-snapshot-every", "0"])
    assert code != 0 and "--cache-snapshot-every 0" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_two_lookalike_pairs_sharing_one_folder_never_read_each_others_rows(pairs, tmp_path):
    """Two pairs of one architecture with other weights (norms at one in both, so
    `Pair.identity` alone cannot tell them apart) share a folder, with memory on:
    each gets its own cold tokens, nothing of the other's is reused, and a file of
    the other pair's under this pair's key is skipped with one line."""
    folder = tmp_path / "other"
    write_target(folder, "qwen3", seed=5)
    target, tok = load_target(str(folder))
    config = json.loads((folder / "config.json").read_text())
    other = Pair.make(target, random_drafter(drafter_config_dict(config, "dflash2", block_size=8), seed=2))
    pair, _ = pairs["qwen3"]
    ids = SYSTEM + [5]
    cold = {"mine": answer(pair, tok, ids)[0], "other": answer(other, tok, ids)[0]}
    assert cold["mine"] != cold["other"]  # else the test could not see a mix-up
    settings = CacheSettings(block_tokens=S, folder=tmp_path / "shared")
    mine = PromptCache(pair, settings)
    answer(pair, tok, ids, mine)
    lines = []
    theirs = PromptCache(other, settings, warn=lines.append)
    out, reuse = answer(other, tok, ids, theirs)
    assert out == cold["other"] and reuse.tokens == 0
    assert theirs.fingerprint != mine.fingerprint
    # Disk only, after a restart: each pair reads back only its own blocks.
    disk = replace(settings, memory_bytes=0)
    for p, name in [(pair, "mine"), (other, "other")]:
        out, reuse = answer(p, tok, ids, PromptCache(p, disk))
        assert out == cold[name] and reuse.disk >= 3 * S
    # The other pair's first block under this pair's name: its header names the other pair.
    key_mine = block_keys(PromptCache(pair, disk).fingerprint, ids, S)[0]
    key_theirs = block_keys(theirs.fingerprint, ids, S)[0]
    os.replace(tmp_path / "shared" / f"{key_theirs}.safetensors", tmp_path / "shared" / f"{key_mine}.safetensors")
    out, reuse = answer(pair, tok, ids, PromptCache(pair, disk, warn=lines.append))
    assert out == cold["mine"] and reuse.tokens == 0
    assert len(lines) == 1 and key_mine in lines[0] and "another model" in lines[0]


def test_a_disk_only_restart_tells_prompts_apart_that_share_only_a_later_block(pairs, tmp_path):
    """Block keys are chained: two prompts with the same second block after
    different first blocks share no key, so after a restart (disk only) neither
    reads the other's second block (whose rows depend on the first)."""
    pair, tok = pairs["qwen3"]
    first = [[(3 * i + 1) % 200 + 5 for i in range(S)], [(5 * i + 2) % 200 + 5 for i in range(S)]]
    shared = [(7 * i + 3) % 200 + 5 for i in range(S)]
    asks = [head + shared + [9, 10] for head in first]
    cold = [answer(pair, tok, ids)[0] for ids in asks]
    assert cold[0] != cold[1]
    disk = CacheSettings(block_tokens=S, memory_bytes=0, folder=tmp_path)
    answer(pair, tok, asks[0], PromptCache(pair, disk))
    out, reuse = answer(pair, tok, asks[1], PromptCache(pair, disk))
    assert out == cold[1] and reuse.tokens == 0
    again = [answer(pair, tok, ids, PromptCache(pair, disk)) for ids in asks]
    assert [g[0] for g in again] == cold and all(g[1].disk == 2 * S for g in again)


def test_blocks_of_a_run_that_left_rows_unread_hold_what_reading_it_gives_the_drafter(pairs):
    """A plain run leaves its last rows unread by the drafter (DecodeCache.unread);
    keeping them in blocks runs them in first, so a prompt restored from the
    blocks drafts from the rows reading the conversation at once would give."""
    import mlx.core as mx
    from dflash2_mlx.engine.decode.loop import DecodeCache, prefill
    from dflash2_mlx.engine.decode.state import FixedBlock
    from helpers import decode_steps

    pair, tok = pairs["qwen3"]
    pcache = PromptCache(pair, CacheSettings(block_tokens=S))
    ids = SYSTEM[:20]
    cache, prompt, _ = pcache.prepare(ids)
    request = DecodeRequest(max_tokens=30, block_size=None)
    out = [t for s in decode_steps(prompt, pair, request, policy=FixedBlock(1), prompt_cache=cache)
           for t in s.tokens]  # plain steps
    assert cache.unread is not None and cache.drafter[0].offset < 3 * S  # the premise: blocks 1, 2 unread
    pcache.put(cache)
    pcache.live.clear()  # from the blocks, not the tail
    restored, reuse = pcache.take(ids + out + [5])
    assert reuse.tokens == 3 * S
    read = DecodeCache(pair.target.make_cache(), pair.drafter.make_cache())
    prefill(mx.array((ids + out)[: 3 * S], dtype=mx.int32), pair, read)
    read.catch_up(pair.drafter)
    for a, b in zip(restored.drafter, read.drafter):
        assert a.offset == b.offset == 3 * S
        assert mx.allclose(a.state[0][..., : a.offset, :], b.state[0][..., : b.offset, :], atol=1e-4).item()
