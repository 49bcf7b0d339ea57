"""Time to first token of a real agent session's turns: Claude Code against `dflash2 serve`.

    python benchmarks/serve/agent_ttft.py --repeats 3 --json benchmarks/results/agent-ttft-cpu.json

Claude Code (`claude -p`, the version pinned in tests/agent_clis, its default configuration:
its whole system prompt and every tool, ~17k tokens of the target's) asks a question, then
`claude -p --continue` asks a second one in the same session. Claude Code reports the time to
its first token itself (`ttft_ms` in its JSON result) and how much of the prompt the server
read from its cache (`cache_read_input_tokens`). A third turn opens a new session on the same
server: it shares the system prompt and the tools with the first. Each repeat starts a new
server (an empty prompt cache). The target is the fixed-answer look-alike of the agent tests
(dflash2_mlx/tools/synthetic.py), a tiny model whose context holds the whole prompt, made heavier
than the tests' (--layers, --heads, --head-dim: 2 layers of 2 heads of 32 by default) so that its
prefill takes seconds; what the cache saves is what carries over to a real model.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "serve"))
sys.path.insert(0, str(ROOT / "tests"))

from agent_clis import installed_clis, json_lines, sealed_env  # noqa: E402  (the pinned CLIs)
from serve import start_server, stop_server  # noqa: E402  (benchmarks/serve/serve.py)
from dflash2_mlx.device import backend_name  # noqa: E402
from dflash2_mlx.files import atomic_write_text  # noqa: E402
from dflash2_mlx.tools.provenance import command_line, provenance  # noqa: E402
from dflash2_mlx.tools.synthetic import write_fixed_answer_target  # noqa: E402

TURNS = [("first turn", [], "What does this project do? Answer in one sentence."),
         ("second turn, same session", ["--continue"], "And how do I run its tests?"),
         ("new session, same server", [], "List three files you would read first.")]


def turn(claude: str, url: str, work: Path, extra: list, prompt: str) -> dict:
    env = {**sealed_env(work / "home"), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "unused", "PWD": str(work)}
    done = subprocess.run([claude, "-p", prompt, "--model", "lookalike", "--output-format", "json", *extra],
                          env=env, cwd=work, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"error: claude exited with {done.returncode}: {(done.stdout + done.stderr)[-400:]}")
    result = json_lines(done.stdout)[-1]
    usage = result["usage"]
    return {"ttft_s": result["ttft_ms"] / 1000, "prompt_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"],
            "cached_tokens": usage["cache_read_input_tokens"], "answer": result["result"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    args = ap.parse_args()
    claude = installed_clis()["claude"]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model = write_fixed_answer_target(Path(tmp) / "lookalike", layers=args.layers, heads=args.heads,
                                          head_dim=args.head_dim)
        for r in range(args.repeats):
            proc, url = start_server(["--model", str(model), "--ar", "--served-model-name", "lookalike"])
            try:
                work = Path(tmp) / f"repeat-{r}"
                work.mkdir()
                session = []
                for name, extra, prompt in TURNS:
                    where = work if name != "new session, same server" else work / "other"
                    where.mkdir(exist_ok=True)
                    session.append({"turn": name, **turn(claude, url, where, extra, prompt)})
                    print(f"repeat {r + 1}: {name}: TTFT {session[-1]['ttft_s']:.2f} s, "
                          f"{session[-1]['cached_tokens']:,} of {session[-1]['prompt_tokens']:,} prompt tokens cached",
                          file=sys.stderr)
                runs.append(session)
            finally:
                stop_server(proc)
    summary = {name: {"ttft_s_median": statistics.median(s[i]["ttft_s"] for s in runs),
                      "cached_tokens_median": statistics.median(s[i]["cached_tokens"] for s in runs),
                      "prompt_tokens_median": statistics.median(s[i]["prompt_tokens"] for s in runs)}
               for i, (name, _, _) in enumerate(TURNS)}
    out = {"what": "time to first token of Claude Code's turns against dflash2 serve (fixed-answer look-alike, --ar)",
           "backend": backend_name(), "machine": platform.machine(), "client": "claude-code 2.1.328",
           "lookalike": {"layers": args.layers, "heads": args.heads, "head_dim": args.head_dim},
           "summary": summary, "runs": runs, **provenance(command_line("python benchmarks/serve/agent_ttft.py", sys.argv[1:]))}
    print(json.dumps(summary, indent=1))
    if args.json:
        atomic_write_text(args.json, json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
