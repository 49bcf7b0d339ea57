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

HERE = Path(__file__).parent / "agent_clis"
BIN = HERE / "node_modules" / ".bin"
NAMES = ("codex", "claude", "opencode")


def installed_clis() -> dict:
    """{name: executable} of the pinned CLIs, installing them once; skips without node and npm."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are not installed: the real agent CLI tests need them (Debian: apt-get install nodejs npm)")
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


# Every token of it distinct, and none a token the tests' prompts end with (see fixed_answer_lookalike).
ANSWER = " Answer from the tiny model"


def fixed_answer_lookalike(folder: Path, context: int = 65536, answer: str = ANSWER) -> Path:
    """A tiny qwen3 in the real format, with the built-in target's tokenizer and chat template
    (which renders tools) and a context that holds the clients' default prompts (Claude Code's
    is ~28k of its tokens), whose greedy answer to any prompt is `answer` and then its
    end-of-text token: the protocol's model (issue 47 allows a look-alike), whose answer a
    test can find in a client's output. Its weights are set, not trained: every layer's output
    projections are zero, so the last hidden state is the last token's embedding; embeddings
    of ordinary tokens share one direction, which the head maps to the answer's first token,
    and each answer token has a direction of its own, mapped to the token after it (the last
    to end-of-text). So a prompt whose last token is one of the answer's gets the answer's rest
    only. Every layer still runs: the prefill and the prompt cache are real."""
    from dflash2_mlx.tools.synthetic import write_target
    from tokenizers import Tokenizer
    import mlx.core as mx

    if (folder / "config.json").exists():
        return folder
    hidden = 64
    write_target(folder, "qwen3", hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=4096,
                 max_position_embeddings=context, tie_word_embeddings=False)
    builtin = Path(__file__).resolve().parents[1] / "dflash2_mlx" / "builtin" / "target"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        shutil.copy(builtin / name, folder / name)
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(answer).ids
    assert len(set(ids)) == len(ids) and 0 not in ids and len(ids) < hidden, "answer tokens must be distinct"
    weights = dict(mx.load(str(folder / "model.safetensors")))
    vocab = weights["model.embed_tokens.weight"].shape[0]
    embed = 0.01 * mx.random.normal((vocab, hidden), key=mx.random.key(0))
    embed[:, 0] = 1.0  # the direction every ordinary token shares
    head = mx.zeros((vocab, hidden))
    head[ids[0], 0] = 10.0
    for i, token in enumerate(ids):  # answer token i: its own direction, read as "next is token i + 1"
        embed[token] = mx.zeros((hidden,))
        embed[token, i + 1] = 1.0
        head[ids[i + 1] if i + 1 < len(ids) else 0, i + 1] = 10.0
    weights["model.embed_tokens.weight"], weights["lm_head.weight"] = embed, head
    for name in list(weights):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros_like(weights[name])
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder
