"""Requests/s and time to first token of `dflash2 serve` under N concurrent clients.

    nice python benchmarks/serve.py --clients 4 --requests 2 --max-tokens 32 \
        --json docs/results/serve-cpu.json

For each arm (plain autoregressive `--ar`, then DFlash 2) it starts a real
`dflash2 serve` on a free loopback port, sends one warm-up request, then runs
`--clients` streaming clients at once, each sending `--requests` chat requests
(T = 0) with the built-in suite prompts, each client starting at a different
prompt. Time to first token is from sending the request to the first
non-empty content chunk; requests/s is all requests over the wall time of the
concurrent phase. The server queues requests (one generation at a time), so
TTFT includes queueing: that is what a client of a loaded server sees.
"""

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from dflash2_mlx.tools.suites import SUITES  # noqa: E402

PROMPTS = [p for suite in ("code", "chat", "maths") for p in SUITES[suite]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dflash2_mlx.cli", "serve", "--port", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: dflash2 serve exited: {proc.stderr.read().strip()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("error: dflash2 serve did not start within 300 s")


def stream_chat(url: str, messages: list, max_tokens: int) -> dict:
    """One streamed chat request at T = 0: time to the first content chunk, the whole
    latency, the text and the usage."""
    body = {"model": "builtin", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    tic = time.perf_counter()
    ttft, usage, text = None, None, []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            piece = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - tic
                text.append(piece)
    return {"ttft_s": ttft, "latency_s": time.perf_counter() - tic, "text": "".join(text), "usage": usage}


def one_request(url: str, prompt: str, max_tokens: int) -> dict:
    out = stream_chat(url, [{"role": "user", "content": prompt}], max_tokens)
    return {k: out[k] for k in ("ttft_s", "latency_s", "usage")}


def run_arm(name: str, extra: list[str], args) -> dict:
    proc, url = start_server(extra)
    try:
        one_request(url, "Hello.", 4)  # warm-up: first-call compilation and allocation
        results: list[dict] = []
        lock = threading.Lock()

        def client(c: int):
            for r in range(args.requests):
                out = one_request(url, PROMPTS[(c + r) % len(PROMPTS)], args.max_tokens)
                with lock:
                    results.append(out)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        tic = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - tic
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ttfts = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    spec = [r["usage"]["dflash2"] for r in results if r["usage"].get("dflash2")]
    passes = sum(s["target_passes"] for s in spec)
    committed = sum(s["mean_acceptance_length"] * s["target_passes"] for s in spec)
    return {
        "arm": name, "server_flags": extra, "requests": len(results), "wall_s": wall,
        "requests_per_s": len(results) / wall, "completion_tokens": tokens, "tokens_per_s": tokens / wall,
        "ttft_median_s": statistics.median(ttfts), "ttft_p90_s": ttfts[max(0, round(0.9 * len(ttfts)) - 1)],
        "ttft_min_s": ttfts[0], "latency_median_s": statistics.median(r["latency_s"] for r in results),
        "mean_acceptance_length": committed / passes if passes else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args()
    from dflash2_mlx.device import backend_name
    from dflash2_mlx.tools.provenance import command_line, provenance
    import mlx.core as mx

    arms = [run_arm("ar", ["--ar"], args), run_arm("dflash2", [], args)]
    record = {
        "benchmark": "serve", **provenance(command_line(Path(sys.executable).name, sys.argv)),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "backend": backend_name(),
        "machine": platform.machine(), "mlx": mx.__version__, "pair": "builtin",
        "clients": args.clients, "requests_per_client": args.requests, "max_tokens": args.max_tokens,
        "temperature": 0, "arms": arms,
    }
    for a in arms:
        print(f"{a['arm']:8s} {a['requests_per_s']:.2f} req/s  {a['tokens_per_s']:.1f} tok/s  "
              f"TTFT median {a['ttft_median_s'] * 1000:.0f} ms  p90 {a['ttft_p90_s'] * 1000:.0f} ms")
    text = json.dumps(record, indent=2) + "\n"
    if args.json:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")  # no partial file if interrupted
        tmp.write_text(text)
        tmp.replace(args.json)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
