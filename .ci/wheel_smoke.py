"""The package as users install it: run from outside the checkout, with the
interpreter of a fresh virtual environment that holds only the built wheel.

`dflash2 generate`, `dflash2 doctor`, and `dflash2 serve` answering one chat
completion and the page at `/`; standard library only (the wheel brings no
HTTP client). Exits non-zero with one line naming the step that failed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DFLASH2 = str(Path(sys.executable).with_name("dflash2"))


def step(name: str, argv: list[str], timeout: float = 300) -> str:
    print(f"wheel check: {name}", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"wheel check failed: {name} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def serve_once() -> None:
    print("wheel check: dflash2 serve (one chat completion, then /)", flush=True)
    server = subprocess.Popen([DFLASH2, "serve", "--port", "0", "--max-tokens", "16"],
                              stderr=subprocess.PIPE, text=True)
    try:
        url, said = None, []
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            line = server.stderr.readline()
            said.append(line.strip())
            if not line:
                sys.exit(f"wheel check failed: dflash2 serve exited {server.wait()} before serving: {' '.join(said)}")
            if found := re.search(r"on (http://[^\s]+)", line):
                url = found.group(1)
        if url is None:
            sys.exit("wheel check failed: dflash2 serve did not start in 300 s")
        body = json.dumps({"messages": [{"role": "user", "content": "def fib(n):"}], "max_tokens": 16}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            answer = json.load(r)
        if not isinstance(answer["choices"][0]["message"]["content"], str) or answer["usage"]["completion_tokens"] < 1:
            sys.exit(f"wheel check failed: the chat completion is not an answer: {answer}")
        with urllib.request.urlopen(url + "/", timeout=60) as r:
            page = r.read().decode()
        if "<html" not in page.lower():
            sys.exit("wheel check failed: / does not answer the page")
        server.send_signal(signal.SIGINT)
        if server.wait(timeout=60) != 0:
            sys.exit(f"wheel check failed: dflash2 serve exited {server.returncode} after Ctrl-C")
    finally:
        if server.poll() is None:
            server.kill()


def main() -> None:
    if Path.cwd().resolve() == Path(__file__).resolve().parents[1] or (Path.cwd() / "dflash2_mlx").exists():
        sys.exit("wheel check: run it from outside the checkout (the checkout's folder would shadow the wheel)")
    import dflash2_mlx  # the installed one, not a checkout's

    if "site-packages" not in dflash2_mlx.__file__:
        sys.exit(f"wheel check failed: dflash2_mlx comes from {dflash2_mlx.__file__}, not an installed wheel")
    out = step("dflash2 generate", [DFLASH2, "generate", "-p", "def fib(n):", "-m", "24", "--json"])
    if not json.loads(out)["token_ids"]:
        sys.exit("wheel check failed: dflash2 generate gave no tokens")
    step("dflash2 doctor", [DFLASH2, "doctor"])
    serve_once()
    print("wheel check: passed", flush=True)


if __name__ == "__main__":
    os.environ.pop("PYTHONPATH", None)
    main()
