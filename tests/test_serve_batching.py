"""`dflash2 serve` batches concurrent requests (docs/batching.md): the same
answers as one request at a time, the batch in `usage` and `/metrics`, and a
target whose caches cannot batch runs one at a time with that said in `usage`."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers import drafter_folder, target_folder
from serve_helpers import Server

REQUESTS = [
    dict(messages=[{"role": "user", "content": "Write a python function that adds two numbers."}], max_tokens=24,
         temperature=0),
    dict(messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=16, temperature=0.8,
         seed=11),
    dict(messages=[{"role": "user", "content": "Count from 1 to 10."}], max_tokens=30, temperature=0, stop=["5"]),
    dict(messages=[{"role": "user", "content": "Explain recursion briefly."}], max_tokens=20, temperature=0,
         logprobs=True, top_logprobs=2),
]


def _burst(url: str, bodies: list) -> list:
    barrier = threading.Barrier(len(bodies))

    def post(body):
        barrier.wait()
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    started = [Server("--max-batch", "4", tmp=tmp, wait=False), Server("--max-batch", "1", tmp=tmp, wait=False)]
    try:
        for s in started:
            s.wait_ready()
        yield started
    finally:
        for s in started:
            code, log = s.stop()
            assert code == 0 and "Traceback" not in log, log


@pytest.mark.slow
def test_concurrent_requests_share_passes_and_answer_as_one_at_a_time(servers):
    batched, single = servers
    together = _burst(batched.url, REQUESTS)
    alone = [_burst(single.url, [body])[0] for body in REQUESTS]
    for t, a in zip(together, alone):
        assert t["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        assert t["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
        assert a["usage"]["dflash2_batch"] == {"size": 1, "max_batch": 1}
    sizes = [t["usage"]["dflash2_batch"]["size"] for t in together]
    assert max(sizes) >= 2 and all(t["usage"]["dflash2_batch"]["max_batch"] == 4 for t in together)
    lp_t = [c["logprob"] for c in together[3]["choices"][0]["logprobs"]["content"]]
    lp_a = [c["logprob"] for c in alone[3]["choices"][0]["logprobs"]["content"]]
    assert lp_t == pytest.approx(lp_a, abs=1e-5)
    metrics = httpx.get(batched.url + "/metrics").text
    count = next(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("dflash2_batch_size_count"))
    at_most_one = next(float(l.split()[-1]) for l in metrics.splitlines()
                       if l.startswith('dflash2_batch_size_bucket{le="1"}'))
    assert count > at_most_one  # some passes ran more than one sequence
    assert float(batched.metric("dflash2_batch_tokens_per_pass")) > 1


@pytest.mark.slow
def test_a_target_that_cannot_batch_runs_one_at_a_time_and_says_so(tmp_path):
    server = Server("--model", str(target_folder("qwen3_5")), "--drafter", str(drafter_folder("qwen3_5")),
                    "--block-size", "4", "--max-batch", "4", tmp=tmp_path)
    try:
        answers = _burst(server.url, [dict(messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           temperature=0)] * 2)
    finally:
        code, log = server.stop()
    assert code == 0 and "recurrent" in log
    for a in answers:
        batch = a["usage"]["dflash2_batch"]
        assert batch["size"] == 1 and batch["max_batch"] == 1 and "recurrent" in batch["note"]
