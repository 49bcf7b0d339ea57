"""Aggregate tokens/s, time to first token and inter-token latency of `dflash2 serve` and
`mlx_lm.server` under 1, 2, 4 and 8 concurrent clients.

    python benchmarks/serve/serve.py --clients 1,2,4,8 --requests 3 --max-tokens 64 --repeats 5 \
        --interleave --arms dflash2,ar,mlx_lm --json benchmarks/results/serve-batching-cpu.json
    python benchmarks/serve/serve.py --smoke --json /tmp/serve-smoke.json   # 1 client, 1 request, 4 tokens

Arms (`--arms` picks a subset, run in the order given, reversed every other --repeats run; default all four):
  dflash2  `dflash2 serve` with its default flags (batched, --block-size auto)
  ar       `dflash2 serve --ar` (batched plain decoding)
  serial   `dflash2 serve --max-batch 1` (one request at a time, the server before batching)
  mlx_lm   `python -m mlx_lm server --model <the target's folder>` (batches concurrent requests)
`--serve-flags='...'` adds flags to every dflash2 arm; `--arm-flags 'ARM=FLAGS'` (repeatable)
replaces one arm's own flags (for mlx_lm: adds to --model), e.g. `--arm-flags 'serial=--ar
--max-batch 1'`. A `dflash2 serve` without --max-batch (before batching) runs the serial arm
with its default flags, and the JSON says so.

Each arm is a fresh server on a free loopback port, warmed up with one request, then for each
client count: that many streaming clients at once, each sending `--requests` chat requests
(T = 0, no seed: mlx_lm.server does not batch seeded requests) with the built-in suite
prompts, each client starting at a different prompt. Arms run one after the other, never at
the same time (they would share the cores); a shared machine's other work shows as differences
between repeats, so the JSON keeps each repeat's tokens/s. `--interleave` starts every arm's
server at once (each repeat, fresh) and runs the arms' phases in turn at each client count, the
order reversed every other phase: still one arm at a time, but phases compared seconds apart
rather than minutes (on this project's 2-core machine the sequential order's drift between arms
was as large as the differences measured). Prompt caches stay on (every
server's default), so a prompt seen at an earlier client count prefills from the cache in
every arm alike.

Per arm and client count: aggregate completion tokens/s and requests/s over the wall time of
the concurrent phase (the median over repeats); time to first token (send to the first
non-empty content chunk: queueing included, what a client of a loaded server sees), median and
p90 over every request; inter-token latency, the gaps between consecutive content chunks as
they arrive (a chunk may carry several tokens, and chunks written together arrive together),
median and p90, and the time per output token after the first, median; the largest
`usage.dflash2_batch.size` a request reported, the server's `max_batch` and any note on why
requests ran alone (absent before batching); each arm's tokens/s over
mlx_lm.server's and over the best dflash2 arm's at that client count. At T = 0 every arm
should write the same text: each request's `parity` says whether its text equals the first
arm's for the same prompt (recorded, not asserted).
"""

import argparse
import json
import math
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402

from dflash2_mlx.tools.suites import SUITES  # noqa: E402

PROMPTS = [p for suite in ("code", "chat", "maths") for p in SUITES[suite]]
ARMS = ("dflash2", "ar", "serial", "mlx_lm")
DFLASH2_FLAGS = {"dflash2": [], "ar": ["--ar"], "serial": ["--max-batch", "1"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra: list[str], command: list[str] = None) -> tuple[subprocess.Popen, str]:
    """`dflash2 serve EXTRA` (or `command`, which takes --port) on a free port, once /health answers.
    Its output goes to a temporary file: a pipe nobody reads fills up and stalls a chatty server."""
    port = free_port()
    command = command or [sys.executable, "-m", "dflash2_mlx.cli", "serve"]
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([*command, "--port", str(port), *extra], stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            lines = log.read().strip().splitlines() or ["(no output)"]
            sys.exit(f"error: {' '.join(command[-2:])} exited with {proc.returncode}: {lines[-1]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"error: {' '.join(command[-2:])} did not answer /health within 300 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.log.close()


def stream_chat(url: str, messages: list, max_tokens: int, model: str = "builtin") -> dict:
    """One streamed chat request at T = 0: time to the first content chunk, the whole
    latency, each content chunk's arrival (seconds from sending), the text and the usage."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    tic = time.perf_counter()
    arrivals, usage, text = [], None, []
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
                arrivals.append(time.perf_counter() - tic)
                text.append(piece)
    return {"ttft_s": arrivals[0] if arrivals else None, "latency_s": time.perf_counter() - tic,
            "arrivals_s": arrivals, "text": "".join(text), "usage": usage}


def arm_command(name: str, args, has_max_batch: bool) -> tuple[list[str], list[str], str]:
    """(command, its flags, the model name requests carry) of one arm."""
    own = args.arm_flags.get(name)
    if name == "mlx_lm":
        from dflash2_mlx.loading.builtin import resolve_builtin

        folder = resolve_builtin(args.model, "target")
        if not Path(folder).is_dir() and not re.fullmatch(r"[\w.-]+/[\w.-]+", folder):
            # mlx_lm.server loads on the first request: a bad model would only show as a hang there.
            sys.exit(f"error: --model {args.model}: no such folder and not a Hub repo id (owner/name)")
        # mlx_lm.server answers the model it was started with under "default_model".
        flags = ["--model", folder, "--log-level", "WARNING", *(own or [])]
        return [sys.executable, "-m", "mlx_lm", "server"], flags, "default_model"
    if own is None:
        own = DFLASH2_FLAGS[name] if has_max_batch or name != "serial" else []
    flags = ["--model", args.model, *own, *shlex.split(args.serve_flags)]
    return [sys.executable, "-m", "dflash2_mlx.cli", "serve"], flags, args.model


def batch_of(usage: dict) -> dict:
    """`usage.dflash2_batch` (docs/batching.md): `size`, the most requests that shared a target
    pass with this one; `max_batch`, the server's; `note`, why it ran alone. {} before batching."""
    return usage.get("dflash2_batch") or {}


def concurrent_phase(url: str, model: str, clients: int, args) -> tuple[float, list[dict]]:
    """`clients` threads, each sending `args.requests` streamed requests one after the other."""
    def client(c: int) -> list[dict]:
        rows = []
        for r in range(args.requests):
            i = (c + r) % len(PROMPTS)
            out = stream_chat(url, [{"role": "user", "content": PROMPTS[i]}], args.max_tokens, model)
            rows.append({"client": c, "prompt": i, **out})
        return rows

    tic = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        rows = [row for rows in pool.map(client, range(clients)) for row in rows]
    return time.perf_counter() - tic, rows


def quantile(values: list, q: float):
    """Nearest-rank quantile (None for no values)."""
    values = sorted(values)
    return values[max(0, math.ceil(q * len(values)) - 1)] if values else None


def summarise(name: str, clients: int, phases: list[tuple[float, list[dict]]]) -> dict:
    """One arm at one client count over its repeats: tokens/s and requests/s are the median of
    the repeats' (each listed too); latencies pool every request."""
    rows = [r for _, rs in phases for r in rs]
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    gaps = [b - a for r in rows for a, b in zip(r["arrivals_s"], r["arrivals_s"][1:])]
    tpots = [(r["arrivals_s"][-1] - r["arrivals_s"][0]) / (r["usage"]["completion_tokens"] - 1) for r in rows
             if r["usage"]["completion_tokens"] > 1 and len(r["arrivals_s"]) > 1]
    tps = [sum(r["usage"]["completion_tokens"] for r in rs) / wall for wall, rs in phases]
    batches = [batch_of(r["usage"]) for r in rows]
    sizes = [b["size"] for b in batches if b.get("size") is not None]
    spec = [r["usage"]["dflash2"] for r in rows if r["usage"].get("dflash2")]
    passes = sum(s["target_passes"] for s in spec)
    committed = sum(s["mean_acceptance_length"] * s["target_passes"] for s in spec)
    return {
        "arm": name, "clients": clients, "repeats": len(phases), "requests": len(rows),
        "wall_s": [wall for wall, _ in phases], "completion_tokens": sum(r["usage"]["completion_tokens"] for r in rows),
        "tokens_per_s": statistics.median(tps), "tokens_per_s_repeats": tps,
        "requests_per_s": statistics.median(len(rs) / wall for wall, rs in phases),
        "ttft_median_s": statistics.median(ttfts) if ttfts else None, "ttft_p90_s": quantile(ttfts, 0.9),
        "itl_median_s": statistics.median(gaps) if gaps else None, "itl_p90_s": quantile(gaps, 0.9),
        "tpot_median_s": statistics.median(tpots) if tpots else None,
        "latency_median_s": statistics.median(r["latency_s"] for r in rows),
        "batch_max": max(sizes) if sizes else None, "batch_mean": statistics.mean(sizes) if sizes else None,
        "server_max_batch": max((b["max_batch"] for b in batches if b.get("max_batch")), default=None),
        "batch_notes": sorted({b["note"] for b in batches if b.get("note")}),
        "mean_acceptance_length": committed / passes if passes else None,
        "parity": statistics.mean(r["parity"] for r in rows),
    }


def start_arm(name: str, args, has_max_batch: bool) -> tuple[str, subprocess.Popen, str, str]:
    """A fresh server of one arm, warmed up: (its command line, process, url, model name)."""
    command, flags, model = arm_command(name, args, has_max_batch)
    proc, url = start_server(flags, command)
    try:
        stream_chat(url, [{"role": "user", "content": "Hello."}], 4, model)  # warm-up: loading, first calls
    except BaseException:
        stop_server(proc)
        raise
    return shlex.join(["python", *command[1:], *flags]), proc, url, model


def run_phase(url: str, model: str, clients: int, args, reference: dict) -> tuple[float, list[dict]]:
    """One concurrent phase; `reference` (prompt -> text), filled by the first arm run, gives parity."""
    wall, rows = concurrent_phase(url, model, clients, args)
    for r in rows:
        r["parity"] = r["text"] == reference.setdefault(r["prompt"], r["text"])
    return wall, rows


def run_arm(name: str, args, has_max_batch: bool, reference: dict) -> tuple[str, dict]:
    """One fresh server, every client count in turn: (its command, client count -> (wall, rows))."""
    command, proc, url, model = start_arm(name, args, has_max_batch)
    try:
        return command, {clients: run_phase(url, model, clients, args, reference) for clients in args.clients}
    finally:
        stop_server(proc)


def run_repeat_interleaved(rep: int, args, has_max_batch: bool, reference: dict) -> dict:
    """`--interleave`: a fresh server of every arm at once (idle but one), and at each client count
    every arm's phase in turn, the order reversed at every other phase: arms compared minutes apart
    see a shared machine's drift, phases seconds apart far less. name -> (command, clients -> phase)."""
    servers = {}
    try:
        for name in args.arms:
            servers[name] = start_arm(name, args, has_max_batch)
        done = {name: (command, {}) for name, (command, _, _, _) in servers.items()}
        for k, clients in enumerate(args.clients):
            for name in (args.arms if (rep + k) % 2 == 0 else args.arms[::-1]):
                _, _, url, model = servers[name]
                done[name][1][clients] = run_phase(url, model, clients, args, reference)
    finally:
        for _, proc, _, _ in servers.values():
            stop_server(proc)
    return done


def run_all(args, has_max_batch: bool) -> tuple[list[dict], list[dict], dict]:
    """Every arm, `--repeats` times, in the given order then reversed, alternately (a machine
    that slows down over the run does not favour one arm); with `--interleave`, every arm's
    servers at once and their phases in turn. (arms, requests, reference texts)."""
    reference, commands = {}, {}
    phases = {(a, c): [] for a in args.arms for c in args.clients}
    requests = []
    for rep in range(args.repeats):
        if args.interleave:
            runs = run_repeat_interleaved(rep, args, has_max_batch, reference).items()
        else:
            runs = ((name, run_arm(name, args, has_max_batch, reference))
                    for name in (args.arms if rep % 2 == 0 else args.arms[::-1]))
        for name, (commands[name], done) in runs:
            for clients, (wall, rows) in done.items():
                phases[name, clients].append((wall, rows))
                requests += [{"arm": name, "repeat": rep, "clients": clients, "client": r["client"],
                              "prompt": r["prompt"], "ttft_s": r["ttft_s"], "latency_s": r["latency_s"],
                              "completion_tokens": r["usage"]["completion_tokens"], "chunks": len(r["arrivals_s"]),
                              "batch": batch_of(r["usage"]).get("size"), "parity": r["parity"]} for r in rows]
    arms = [{"arm": a, "command": commands[a], "runs": [summarise(a, c, phases[a, c]) for c in args.clients]}
            for a in args.arms]
    return arms, requests, reference


def add_ratios(arms: list[dict]) -> None:
    """Each run's tokens/s over mlx_lm.server's and over the best dflash2 arm's, same client count."""
    runs = [run for arm in arms for run in arm["runs"]]
    for run in runs:
        peers = [r for r in runs if r["clients"] == run["clients"]]
        base = [r["tokens_per_s"] for r in peers if r["arm"] == "mlx_lm"]
        best = [r["tokens_per_s"] for r in peers if r["arm"] != "mlx_lm"]
        run["x_mlx_lm"] = run["tokens_per_s"] / base[0] if base else None
        run["x_best_dflash2"] = run["tokens_per_s"] / max(best) if best else None


def table(arms: list[dict]) -> str:
    def ms(s):
        return f"{s * 1000:6.0f}" if s is not None else "     -"

    def x(v):
        return f"{v:5.2f}" if v is not None else "    -"

    lines = ["arm      clients  tok/s  req/s  TTFT ms med    p90  ITL ms med    p90  batch  x mlx_lm  x best  parity"]
    for arm in arms:
        for r in arm["runs"]:
            lines.append(f"{r['arm']:8s} {r['clients']:7d} {r['tokens_per_s']:6.1f} {r['requests_per_s']:6.2f} "
                         f"{ms(r['ttft_median_s'])}     {ms(r['ttft_p90_s'])} {ms(r['itl_median_s'])}     "
                         f"{ms(r['itl_p90_s'])}  {r['batch_max'] if r['batch_max'] is not None else '-':>5} "
                         f"   {x(r['x_mlx_lm'])}   {x(r['x_best_dflash2'])}  {r['parity']:6.0%}")
    return "\n".join(lines)


def serve_has_max_batch() -> bool:
    """Whether this `dflash2 serve` batches (has --max-batch): its --help says."""
    done = subprocess.run([sys.executable, "-m", "dflash2_mlx.cli", "serve", "--help"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    return "--max-batch" in done.stdout


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,2,4,8", help="client counts, comma-separated")
    p.add_argument("--requests", type=int, default=3, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="runs of every arm, order reversed every other run")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--model", default="builtin", help="the target (every arm serves it)")
    p.add_argument("--serve-flags", default="", help="more flags for every dflash2 arm, e.g. --serve-flags='--block-size 4'")
    p.add_argument("--arm-flags", action="append", default=[], metavar="ARM=FLAGS",
                   help="replace one arm's own flags (repeatable), e.g. 'serial=--ar --max-batch 1'")
    p.add_argument("--interleave", action="store_true",
                   help="every arm's server up at once (each repeat), their phases in turn at each client count "
                        "(all arms' models in memory together)")
    p.add_argument("--smoke", action="store_true", help="1 client, 1 request, 4 tokens (the test's run)")
    p.add_argument("--json", type=Path, help="write the result here")
    args = p.parse_args(argv)
    if args.smoke:
        args.clients, args.requests, args.max_tokens, args.repeats = "1", 1, 4, 1
    try:
        args.clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        p.error(f"--clients {args.clients!r}: give client counts separated by commas, e.g. 1,2,4,8")
    args.arms = [a.strip() for a in args.arms.split(",")]
    if any("=" not in f for f in args.arm_flags):
        p.error("--arm-flags takes ARM=FLAGS, e.g. 'serial=--max-batch 1'")
    args.arm_flags = {k.strip(): shlex.split(v) for k, v in (f.split("=", 1) for f in args.arm_flags)}
    unknown = [a for a in [*args.arms, *args.arm_flags] if a not in ARMS]
    if unknown:
        p.error(f"unknown arm {unknown[0]!r}: --arms and --arm-flags take {', '.join(ARMS)}")
    if min(args.clients) < 1 or min(args.requests, args.max_tokens, args.repeats) < 1:
        p.error("--clients, --requests, --max-tokens and --repeats must be 1 or more")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from dflash2_mlx.device import backend_name
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance
    import mlx.core as mx

    has_max_batch = serve_has_max_batch()
    load_before = os.getloadavg()  # other work on the machine, which the ratios cannot see
    try:
        arms, requests, reference = run_all(args, has_max_batch)
    except httpx.HTTPError as e:
        sys.exit(f"error: a request failed ({type(e).__name__}: {e}): see the server's flags above")
    add_ratios(arms)
    record = {
        "benchmark": "serve", **provenance(command_line(Path(sys.executable).name, sys.argv)),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "backend": backend_name(),
        "machine": platform.machine(), "mlx": mx.__version__, "model": args.model,
        "clients": args.clients, "requests_per_client": args.requests, "max_tokens": args.max_tokens,
        "repeats": args.repeats, "interleave": args.interleave, "serve_flags": args.serve_flags,
        "arm_flags": args.arm_flags,
        "cpus": os.cpu_count(), "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0]},
        "temperature": 0, "dflash2_serve_batches": has_max_batch,
        "note": None if has_max_batch else "this dflash2 serve has no --max-batch: it serves one request at a "
                                           "time, and the serial arm ran with its default flags",
        "arms": arms, "reference_texts": {str(i): t for i, t in sorted(reference.items())}, "requests": requests,
    }
    print(table(arms))
    if args.json:
        atomic_write_text(args.json, json.dumps(record, indent=2) + "\n")
    else:
        sys.stdout.write(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
