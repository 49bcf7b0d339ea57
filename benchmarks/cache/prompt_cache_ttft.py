"""Time to first token of `dflash2 serve` cold, warm from memory and warm from disk after a restart.

    python benchmarks/cache/prompt_cache_ttft.py --json benchmarks/results/prompt-cache-ttft-cpu.json

Built-in pair, T = 0, a ~1,500-token prompt (a long system prompt and a
question, through the chat template): a real `dflash2 serve --cache-dir DIR`
on a free loopback port answers it three times per repeat: cold (an empty
folder and a new server), warm from memory (the same server again), and warm
from disk (SIGTERM, a new server on the same folder). Time to first token is
from sending the streamed request to its first content chunk; the server is
warmed up on an unrelated short prompt first, so start-up costs are not in it.
`usage` says where the prompt came from (memory and disk tokens) and every
answer must be the same text.
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "serve"))


from serve import start_server, stream_chat  # noqa: E402  (benchmarks/serve/serve.py)

SYSTEM = " ".join(f"Rule {i}: answer briefly and cite line {i * 7}." for i in range(58))
QUESTION = " ".join(f"Step {i}: add {i} to the total." for i in range(39)) + " ok ok"


def ask(url: str, system: str, user: str, max_tokens: int) -> tuple[float, str, dict]:
    """(seconds to the first content chunk, the answer, usage) of one streamed request."""
    out = stream_chat(url, [{"role": "system", "content": system}, {"role": "user", "content": user}], max_tokens)
    return out["ttft_s"], out["text"], out["usage"] or {}


def one_repeat(args, folder: Path) -> dict:
    serve = ["--cache-dir", str(folder), "--max-tokens", str(args.max_tokens)]
    rows = {}
    proc, url = start_server(serve)
    try:
        ask(url, "", "hi", 2)  # warm-up: nothing of the long prompt
        rows["cold"] = ask(url, SYSTEM, QUESTION, args.max_tokens)
        rows["memory"] = ask(url, SYSTEM, QUESTION, args.max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    proc, url = start_server(serve)
    try:
        ask(url, "", "hi", 2)
        rows["disk"] = ask(url, SYSTEM, QUESTION, args.max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return {tier: {"ttft_s": t, "text": text, "prompt_tokens": u.get("prompt_tokens"),
                   "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens"),
                   "prompt_cache": u.get("dflash2_prompt_cache")} for tier, (t, text, u) in rows.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from dflash2_mlx.device import backend_name
    from dflash2_mlx.files import atomic_write_text
    from dflash2_mlx.tools.provenance import command_line, provenance

    runs = []
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(one_repeat(args, Path(tmp)))
        print(f"repeat {r + 1}: " + ", ".join(f"{tier} {row['ttft_s']:.3f} s ({row['cached_tokens']} cached)"
                                               for tier, row in runs[-1].items()), flush=True)
    median = {tier: statistics.median(run[tier]["ttft_s"] for run in runs) for tier in ("cold", "memory", "disk")}
    record = {
        **provenance(command_line("python benchmarks/cache/prompt_cache_ttft.py", sys.argv[1:] if argv is None else argv)),
        "backend": backend_name(), "machine": platform.machine(), "pair": "builtin",
        "ttft_median_s": median,
        "memory_over_cold": median["memory"] / median["cold"], "disk_over_cold": median["disk"] / median["cold"],
        "same_text": all(run[t]["text"] == runs[0]["cold"]["text"] for run in runs for t in run),
        "runs": runs,
    }
    print(f"median TTFT: cold {median['cold']:.3f} s, memory {median['memory']:.3f} s "
          f"({record['memory_over_cold']:.3f}x), disk after restart {median['disk']:.3f} s "
          f"({record['disk_over_cold']:.3f}x); same text: {record['same_text']}")
    if args.json:
        atomic_write_text(args.json, json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
