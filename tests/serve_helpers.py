"""A real `dflash2 serve` subprocess on a free loopback port, for the server tests."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`dflash2 serve ARGS` on a port chosen now; `stop()` sends SIGTERM and
    returns (exit code, stderr)."""

    def __init__(self, *args: str, tmp: Path, wait: bool = True, port: int = None, launcher: list = None):
        self.port = port or free_port()  # a port given: a restart where the last server was
        self.url = f"http://127.0.0.1:{self.port}"
        # Appending: the server shares this file's offset, and `output()` seeks it to 0; with "w+" a
        # line the server wrote just then landed at the start, over its first lines.
        path = tmp / f"serve-{self.port}.log"
        path.write_text("")  # a restart on the same port starts a new log, as before
        self.log = open(path, "a+")
        # `launcher`: what runs the CLI instead of `python -m dflash2_mlx.cli` (tests/faulty_serve.py)
        self.proc = subprocess.Popen(
            [*(launcher or [sys.executable, "-m", "dflash2_mlx.cli"]), "serve", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dflash2 serve exited with {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError(f"dflash2 serve did not answer /health in {timeout:.0f} s: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def metric(self, name: str, headers=None) -> float:
        text = httpx.get(self.url + "/metrics", headers=headers or {}, timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, self.output()


def serving(*args: str, tmp, forbidden=("Traceback",)):
    """A module fixture's body: yield a `Server`, then stop it and require a clean exit with
    none of `forbidden` in its log."""
    s = Server(*args, tmp=tmp)
    try:
        yield s
    finally:
        code, log = s.stop()
        assert code == 0 and not any(f in log for f in forbidden), log[-3000:]


def oai(s: Server, key: str = "unused"):
    """The official OpenAI client for `s`: no retries, so every status the server answers is seen."""
    import openai

    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0, timeout=120)


def ant(s: Server, key: str = "unused"):
    """The official Anthropic client for `s`, as `oai`."""
    import anthropic

    return anthropic.Anthropic(base_url=s.url, api_key=key, max_retries=0, timeout=120)
