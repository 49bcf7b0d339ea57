"""16 clients x 5 mixed requests against one real `dflash2 serve` (issue 24's load test).

Streamed and not, chat, completions and Anthropic messages, stop strings, T = 0 and seeded
T > 0 at two temperatures, some streams closed after their first chunk, and a ~1,000-token
prompt sent once a third of the run is done. Then: every request finished or was cancelled as
asked, nothing answered 5xx, every T = 0 answer equals the same request sent alone afterwards
(one at a time, same server), each seeded request (sent by two or three clients during the
run) gave one text, and the server still answers right: follow-ups sharing a prefix with
earlier requests (read from its prompt cache) equal a cold server's (`--cache-bytes 0`).
Holds for a server that batches and for one that queues (a serial server is correct, just
slow). About 30-45 s on the shared 2-core CPU.
"""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_helpers import Server

CLIENTS, PER_CLIENT = 16, 5
TOPICS = ["the sea", "a cat", "prime numbers", "a red bicycle", "rain in the city", "a stack in Python"]
LONG = " ".join(f"Rule {i}: keep line {i} short and cite page {i * 3}." for i in range(55))  # ~1,000 tokens
LONG_AT = (6, 1)  # client 6's second request: it waits for a third of the run first
CANCEL_MAX = 200  # far more than the first chunk: a closed stream is cancelled, not finished


def chat(prompt: str, **kw) -> dict:
    messages = [{"role": "user", "content": prompt}]
    return {"path": "/v1/chat/completions", "body": {"model": "builtin", "messages": messages, "temperature": 0, **kw}}


def plan(c: int, j: int) -> dict:
    """Client c's request j: one of eight kinds, spread so that each kind runs on several clients."""
    k = c * PER_CLIENT + j
    prompt = f"Tell me about {TOPICS[k % len(TOPICS)]}."
    n = 4 + k % 5  # 4..8 tokens: sequences of different lengths
    if (c, j) == LONG_AT:
        return {**chat(LONG + " Which rule comes first?", max_tokens=6), "kind": "long"}
    kind = ("stream", "plain", "stop", "seeded", "cancel", "completions", "anthropic", "stream")[k % 8]
    if kind == "stream":
        return {**chat(prompt, max_tokens=n, stream=True), "kind": kind}
    if kind == "stop":
        return {**chat(prompt, max_tokens=n + 4, stop=["e", "o"]), "kind": kind}
    if kind == "seeded":  # (k // 8) % 4 picks one of four seeded requests: each is sent by several clients
        s = (k // 8) % 4
        return {**chat(TOPICS[s], max_tokens=6, temperature=(0.7, 1.0)[s % 2], top_p=0.95, seed=100 + s,
                       stream=s % 2 == 0), "kind": kind}
    if kind == "cancel":
        return {**chat(TOPICS[(k // 8) % 2], max_tokens=CANCEL_MAX, stream=True), "kind": kind}
    if kind == "completions":
        body = {"model": "builtin", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": (k // 8) % 2 == 1}
        return {"path": "/v1/completions", "kind": kind, "body": body}
    if kind == "anthropic":
        return {"path": "/v1/messages", "kind": kind,
                "body": {"model": "builtin", "max_tokens": n, "messages": [{"role": "user", "content": prompt}]}}
    return {**chat(prompt, max_tokens=n), "kind": kind}


def piece(chunk: dict) -> str:
    if not chunk.get("choices"):
        return ""
    choice = chunk["choices"][0]
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def send(client: httpx.Client, url: str, spec: dict) -> dict:
    """One request as `spec` says: its status, text, finish reason, usage, and whether it was
    closed after its first content chunk (the cancel kind) and whether the stream ended with [DONE]."""
    body = spec["body"]
    if not body.get("stream"):
        r = client.post(url + spec["path"], json=body)
        if r.status_code != 200:
            return {"status": r.status_code, "error": r.text}
        out = r.json()
        if spec["path"] == "/v1/messages":
            return {"status": 200, "text": "".join(b["text"] for b in out["content"]), "finish": out["stop_reason"],
                    "usage": out["usage"]}
        choice = out["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        return {"status": 200, "text": text, "finish": choice["finish_reason"], "usage": out["usage"]}
    text, finish, usage, done = [], None, None, False
    with client.stream("POST", url + spec["path"], json={**body, "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": r.read().decode()}
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            text.append(piece(chunk))
            usage = chunk.get("usage") or usage
            finish = (chunk.get("choices") or [{}])[0].get("finish_reason") or finish
            if spec["kind"] == "cancel" and "".join(text):
                break  # closing the stream is how a client cancels
    return {"status": 200, "text": "".join(text), "finish": finish, "usage": usage, "done": done}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load")
    warm = Server("--max-queue", "128", tmp=tmp, wait=False)
    cold = Server("--cache-bytes", "0", tmp=tmp, wait=False)  # the reference for "caches consistent"
    try:
        warm.wait_ready()
        cold.wait_ready()
        yield warm, cold
    finally:
        for s in (warm, cold):
            code, log = s.stop()
            assert code == 0 and "Traceback" not in log, log[-3000:]


def concurrent_run(url: str) -> tuple[dict, dict]:
    """All 80 requests, 16 clients at once; the long one waits until a third are done."""
    results, finished = {}, []
    third = threading.Event()
    lock = threading.Lock()
    long_sent = {}

    def one_client(c: int):
        with httpx.Client(timeout=300) as client:
            for j in range(PER_CLIENT):
                spec = plan(c, j)
                if spec["kind"] == "long":
                    assert third.wait(timeout=240)
                    with lock:
                        long_sent["finished_before"] = len(finished)
                out = send(client, url, spec)
                with lock:
                    results[c, j] = out
                    finished.append((c, j))
                    if len(finished) >= CLIENTS * PER_CLIENT // 3:
                        third.set()

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one_client, range(CLIENTS)))
    long_sent["finished_after"] = len(finished) - 1 - finished.index(LONG_AT)
    return results, long_sent


def alone(url: str, spec: dict) -> dict:
    """The request sent on its own; a cancel kind runs to its end (its prefix is checked)."""
    with httpx.Client(timeout=300) as client:
        return send(client, url, {**spec, "kind": "alone"})


@pytest.mark.slow
def test_sixteen_clients_mixed_load(servers):
    warm, cold = servers
    cancelled_before = warm.metric("dflash2_cancelled_total")
    tic = time.monotonic()
    results, long_sent = concurrent_run(warm.url)
    concurrent_s = time.monotonic() - tic
    specs = {(c, j): plan(c, j) for c in range(CLIENTS) for j in range(PER_CLIENT)}
    assert len(results) == CLIENTS * PER_CLIENT
    assert all(r["status"] == 200 for r in results.values()), [r for r in results.values() if r["status"] != 200]
    # The long prompt arrived mid-run: a third were done, and others finished after it was sent.
    assert long_sent["finished_before"] >= CLIENTS * PER_CLIENT // 3 and long_sent["finished_after"] >= 1
    assert results[LONG_AT]["usage"]["prompt_tokens"] >= 900
    # A server that batches (usage.dflash2_batch, docs/batching.md) did run these requests together.
    batches = [r["usage"]["dflash2_batch"] for r in results.values() if (r.get("usage") or {}).get("dflash2_batch")]
    if any(b["max_batch"] > 1 for b in batches):
        assert max(b["size"] for b in batches) > 1, batches

    # Every request finished, or was cancelled, as asked.
    for key, r in results.items():
        kind, stream = specs[key]["kind"], specs[key]["body"].get("stream")
        if kind == "cancel":
            assert r["text"] and not r["done"], key
        else:
            assert r["finish"] in ("stop", "length", "end_turn", "max_tokens", "stop_sequence"), (key, r)
            assert not stream or r["done"], key

    # Seeded T > 0: every copy sent at once gave the same text.
    seeded = {}
    for key, spec in specs.items():
        if spec["kind"] == "seeded":
            seeded.setdefault(json.dumps(spec["body"], sort_keys=True), set()).add(results[key]["text"])
    assert len(seeded) == 4 and all(len(texts) == 1 for texts in seeded.values()), seeded

    # One at a time afterwards, same server: each distinct request gives what it gave under load.
    distinct = {}
    for key, spec in specs.items():
        distinct.setdefault(json.dumps(spec["body"], sort_keys=True), []).append(key)
    for keys in distinct.values():
        spec = specs[keys[0]]
        ref = alone(warm.url, spec)
        assert ref["status"] == 200
        for key in keys:
            if spec["kind"] == "cancel":  # T = 0: a prefix of the full answer, which runs to CANCEL_MAX
                assert ref["text"].startswith(results[key]["text"]) and ref["finish"] == "length", key
            else:
                assert results[key]["text"] == ref["text"], (key, spec["kind"])
        if spec["kind"] == "stop":
            assert "e" not in ref["text"] and "o" not in ref["text"]
    stops = [results[k] for k, s in specs.items() if s["kind"] == "stop"]
    assert sum(r["finish"] == "stop" for r in stops) >= len(stops) // 2  # the stop strings did stop them

    # Every stream closed after its first chunk was cancelled (none had its CANCEL_MAX tokens by then).
    cancels = sum(s["kind"] == "cancel" for s in specs.values())
    deadline = time.monotonic() + 30
    while warm.metric("dflash2_cancelled_total") < cancelled_before + cancels and time.monotonic() < deadline:
        time.sleep(0.1)
    assert warm.metric("dflash2_cancelled_total") == cancelled_before + cancels

    # Caches consistent: follow-ups sharing a prefix with earlier requests (the long prompt, a
    # conversation) read it from the prompt cache and answer as a server with no cache does.
    first = specs[0, 1]["body"]["messages"][0]["content"]
    conversation = chat(first, max_tokens=6)
    conversation["body"]["messages"] += [{"role": "assistant", "content": results[0, 1]["text"]},
                                         {"role": "user", "content": "Tell me more."}]
    seeded_spec = specs[next(k for k, s in specs.items() if s["kind"] == "seeded")]
    cached = []
    for spec in (chat(LONG + " Which rule comes last?", max_tokens=6), conversation, seeded_spec):
        got, ref = alone(warm.url, spec), alone(cold.url, spec)
        assert got["status"] == ref["status"] == 200 and got["text"] == ref["text"], spec["body"]
        cached.append((got["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    assert cached[0] >= 512 and cached[1] > 0, cached  # the prefixes did come from the cache
    print(f"concurrent phase {concurrent_s:.1f} s, {len(distinct)} distinct requests replayed, "
          f"largest batch {max((b['size'] for b in batches), default=None)}")
