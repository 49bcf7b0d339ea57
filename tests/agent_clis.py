"""The real agent CLIs, as users install them: Codex, Claude Code and opencode from the npm
registry, at the versions pinned in tests/agent_clis/package.json (its lock file holds their
hashes). `.ci/run` installs them (`npm install` with the lock file: `npm ci` refuses opencode-ai's optional packages); elsewhere the first test that needs them does,
and every test skips in one line where node is absent.

Each run is sealed off from the machine's own client configuration: HOME, the XDG folders,
CODEX_HOME and CLAUDE_CONFIG_DIR point into the test's folder (opencode's cache of the
`@ai-sdk/openai-compatible` package it fetches at run time is shared between runs).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# The look-alike the CLIs talk to: a context that holds their default prompts, one known answer.
from dflash2_mlx.tools.synthetic import FIXED_ANSWER as ANSWER  # noqa: F401  (for the tests)
from dflash2_mlx.tools.synthetic import write_fixed_answer_target as fixed_answer_lookalike  # noqa: F401

HERE = Path(__file__).parent / "agent_clis"
BIN = HERE / "node_modules" / ".bin"
NAMES = ("codex", "claude", "opencode")


def installed_clis() -> dict:
    """{name: executable} of the pinned CLIs, installing them once; skips without node and npm."""
    if not shutil.which("node") or not shutil.which("npm"):
        why = "node and npm are not installed: the real agent CLI tests need them (Debian: apt-get install nodejs npm)"
        if os.environ.get("DFLASH2_REQUIRE_AGENT_CLIS"):  # CI (.ci/run): a missing client fails
            pytest.fail(why)
        pytest.skip(why)
    if not all((BIN / n).exists() for n in NAMES):
        done = subprocess.run(["npm", "install", "--no-fund", "--no-audit", "--prefix", str(HERE)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return {n: str(BIN / n) for n in NAMES}


def sealed_env(home: Path) -> dict:
    """The environment of one client run: nothing of this machine's own client settings."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "CLAUDE_", "CODEX_", "OPENCODE_"))}
    cache = HERE / ".cache"
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_STATE_HOME=str(home / ".local/state"), XDG_CACHE_HOME=str(cache), CODEX_HOME=str(home / ".codex"),
               CLAUDE_CONFIG_DIR=str(home / ".claude"), DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", NO_COLOR="1")
    (home / ".codex").mkdir(exist_ok=True)
    return env


def json_lines(text: str) -> list:
    """The JSON objects of a client's line-by-line JSON output (other lines skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out