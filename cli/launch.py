"""`dflash2 launch codex|claude|opencode`: an agent CLI on a local model, in one command.

It starts `dflash2 serve` for the model (or reuses one already serving it on --port), then
runs the client configured for that server through the client's own documented settings:
Codex through `-c` overrides (a Responses provider, the model's context window), Claude Code
through its environment (ANTHROPIC_BASE_URL and the model names, its compaction window),
opencode through a config file in a private temporary folder (OPENCODE_CONFIG, merged over
the user's own). Nothing of the user's own client configuration is written. Ctrl-C belongs
to the client (an agent's Ctrl-C interrupts a turn); the server, in a session of its own,
is stopped when the client exits.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash2_mlx.errors import DFlashError

from . import options as o
from . import ui


@dataclass(frozen=True)
class Client:
    executable: str
    package: str  # the npm package that installs it
    prompt_tokens: int  # its default first request, in SmolLM2's tokens (pinned versions, docs/agents.md)
    minimal: str  # how to shrink that prompt


CLIENTS = {
    "codex": Client("codex", "@openai/codex", 10_000, "a shorter base prompt (-c model_instructions_file=FILE)"),
    "claude": Client("claude", "@anthropic-ai/claude-code", 21_000,
                     "--system-prompt TEXT and --tools NAMES (e.g. --tools Bash,Read)"),
    "opencode": Client("opencode", "opencode-ai", 9_000, "an agent with fewer tools and a short prompt in opencode.json"),
}
ANSWER_ROOM = 1_024  # tokens an answer needs beside the prompt before a client is worth starting
DEFAULT_PORT = 8080  # `dflash2 serve`'s: a server already there is reused when it serves the model


def launch(
    client: Annotated[str, typer.Argument(help="The agent CLI to run: codex, claude or opencode.")],
    client_args: Annotated[Optional[list[str]], typer.Argument(
        help="Arguments for the client, after --, e.g. `dflash2 launch claude -- -p \"Fix the test\"`.")] = None,
    model: Annotated[str, typer.Option("--model", help="Target, as `dflash2 serve --model` takes it "
                                                       "(named source, local folder, .gguf, Hub id).")] = "smollm2",
    drafter: o.Drafter = None,
    block_size: o.BlockSize = "auto",
    ar: o.AR = False,
    port: Annotated[Optional[int], typer.Option("--port", help=(
        "Use the server on this loopback port if it serves --model, else start one there (default: reuse one "
        f"on {DEFAULT_PORT}, else start one on a free port)."))] = None,
    debug: o.Debug = False,
):
    """Run Codex, Claude Code or opencode on a local model served by `dflash2 serve`."""
    if client not in CLIENTS:
        raise DFlashError(f"'{client}' is not a client dflash2 launch knows: use codex, claude or opencode")
    spec = CLIENTS[client]
    executable = shutil.which(spec.executable)
    if executable is None:
        raise DFlashError(f"{spec.executable} is not installed: npm install -g {spec.package} (node 20 or newer), "
                          f"then run this again")
    args = list(client_args or [])
    with tempfile.TemporaryDirectory(prefix=f"dflash2-launch-{client}-") as private:
        server = _server(model, drafter, block_size, ar, port, Path(private), debug)
        try:
            context = server.context()
            _check_context(client, spec, context, bool(args))
            env, extra = _configure(client, server.url, model, context, Path(private))
            return _run_client([executable, *extra, *args], env)
        finally:
            server.stop()


# -- the server ------------------------------------------------------------------------


class _Server:
    def __init__(self, url: str, proc: Optional[subprocess.Popen], log: Optional[Path]):
        self.url, self.proc, self.log = url, proc, log

    def context(self) -> Optional[int]:
        cards = _get(self.url + "/v1/models", timeout=10).get("data") or [{}]
        return cards[0].get("max_model_len")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # drains and exits 0 (dflash2 serve)
        try:
            self.proc.wait(timeout=70)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _server(model, drafter, block_size, ar, port, private: Path, debug: bool) -> _Server:
    for candidate in ([port] if port else [DEFAULT_PORT]):
        url = f"http://127.0.0.1:{candidate}"
        health = _get(url + "/health", timeout=2, missing={})
        if health.get("status") == "ok":
            if health.get("model") == model:
                ui.status(f"using the dflash2 server already serving {model} on {url}")
                return _Server(url, None, None)
            if port:
                raise DFlashError(f"the server on port {port} serves '{health.get('model')}', not '{model}': "
                                  f"choose another --port, or leave it out")
    chosen = port or _free_port()
    log = private / "serve.log"
    argv = [sys.executable, "-m", "dflash2_mlx.cli", "serve", "--model", model, "--port", str(chosen),
            "--block-size", block_size, *(["--drafter", drafter] if drafter else []), *(["--ar"] if ar else []),
            *(["--debug"] if debug else [])]
    ui.status(f"starting dflash2 serve for {model} (its log: {log}) …")
    with open(log, "w") as out:  # a session of its own: the terminal's Ctrl-C is the client's
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    server = _Server(f"http://127.0.0.1:{chosen}", proc, log)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: _Server, timeout: float = 3600.0) -> None:
    """Until /health answers ok (a first run may fetch and convert the model, and measure this
    machine's costs: minutes); the server's own last line when it exits instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            lines = [line for line in server.log.read_text(errors="replace").splitlines() if line.strip()]
            raise DFlashError(f"dflash2 serve stopped before it served: {lines[-1] if lines else 'no output'}")
        if _get(server.url + "/health", timeout=2, missing={}).get("status") == "ok":
            return
        time.sleep(0.5)
    raise DFlashError(f"dflash2 serve did not answer in {timeout:.0f} s: see {server.log}")


def _get(url: str, timeout: float, missing=None) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        if missing is None:
            raise DFlashError(f"the server at {url} did not answer") from None
        return missing


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the client --------------------------------------------------------------------------


def _check_context(client: str, spec: Client, context: Optional[int], shrunk: bool) -> None:
    """One line when the model cannot hold the client's default prompt: refused when the client
    runs as it comes, a warning when arguments may have made its prompt smaller."""
    if context is None or context >= spec.prompt_tokens + ANSWER_ROOM:
        return
    line = (f"this model's context ({context:,} tokens) is smaller than {client}'s default prompt (about "
            f"{spec.prompt_tokens:,} tokens): use a model with a longer context, or shrink the prompt with "
            f"{spec.minimal}")
    if not shrunk:
        raise DFlashError(line)
    ui.status("note: " + line)


def _configure(client: str, url: str, model: str, context: Optional[int], private: Path) -> tuple[dict, list]:
    """(environment, leading arguments) that point the client at the server."""
    env = dict(os.environ)
    window = context or 131_072
    output = max(256, min(32_000, window // 4))  # the clients' own default (32k) on a small window leaves no prompt
    if client == "codex":
        provider = (f'model_providers.dflash2={{name="dflash2",base_url="{url}/v1",wire_api="responses",'
                    f'env_key="DFLASH2_LAUNCH_KEY"}}')
        env["DFLASH2_LAUNCH_KEY"] = "unused"  # the server is on loopback with no key
        return env, ["-c", provider, "-c", "model_provider=dflash2", "-c", f"model_context_window={window}",
                     "-c", f"model_max_output_tokens={output}", "-c", f"model={json.dumps(model)}"]
    if client == "claude":
        env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="unused", ANTHROPIC_MODEL=model,
                   ANTHROPIC_DEFAULT_HAIKU_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model,
                   ANTHROPIC_DEFAULT_OPUS_MODEL=model, ANTHROPIC_SMALL_FAST_MODEL=model,
                   CLAUDE_CODE_AUTO_COMPACT_WINDOW=str(window), CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(output),
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        env.pop("ANTHROPIC_AUTH_TOKEN", None)  # it would win over the key
        return env, []
    config = {"$schema": "https://opencode.ai/config.json",
              "provider": {"dflash2": {"npm": "@ai-sdk/openai-compatible", "name": "dflash2 (local)",
                                       "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
                                       "models": {model: {"name": model,
                                                          "limit": {"context": window, "output": output}}}}},
              "model": f"dflash2/{model}"}
    path = private / "opencode.json"
    path.write_text(json.dumps(config, indent=1))
    env["OPENCODE_CONFIG"] = str(path)
    return env, []


def _run_client(argv: list, env: dict) -> int:
    """The client in this terminal; its exit status is the command's. Ctrl-C reaches it (same
    process group) and is ignored here, so this process outlives it and stops the server."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(argv, env=env)
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue
    finally:
        signal.signal(signal.SIGINT, previous)
