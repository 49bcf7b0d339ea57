"""The real agent CLIs against a real `dflash2 serve` (issue 47): Codex (`codex exec`, the
Responses API), Claude Code (`claude -p`, the Anthropic API) and opencode (`opencode run`,
chat completions through `@ai-sdk/openai-compatible`), each as installed from the npm registry
(tests/agent_clis.py) and in its default configuration: every tool, system prompt and
request field it sends by default (10k to 28k tokens of prompt). The target is a tiny
look-alike in the real format whose context holds those prompts and whose answer to any
prompt is one known sentence (agent_clis.fixed_answer_lookalike), so each test can find the
model's answer in what the client reports.

Each test asserts on what the client itself reports: its exit status and its own JSON output
(the answer's text, the tokens it was told were used, the tool it ran and that tool's output).
"""

import json
import subprocess
import sys
from pathlib import Path

import httpx

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import Response

from agent_clis import ANSWER, fixed_answer_lookalike, installed_clis, json_lines, sealed_env
from serve_helpers import free_port, serving
from test_agent_replays import ANTHROPIC_EVENT, ANTHROPIC_EVENTS, RESPONSES_EVENT, RESPONSES_EVENTS, post_sse, validate_event

CAPTURED = Path(__file__).parent / "fixtures" / "agents" / "captured"

PROMPT = "Say hello in one short sentence."


@pytest.fixture(scope="module")
def clis():
    return installed_clis()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent-clis")
    model = fixed_answer_lookalike(tmp / "lookalike")
    for s in serving("--model", str(model), "--ar", "--served-model-name", "lookalike", tmp=tmp):
        s.model_folder = model
        yield s


def run(argv, env, cwd, timeout=420):
    # PWD too: opencode takes its project folder (and so its opencode.json) from it.
    done = subprocess.run(argv, env={**env, "PWD": str(cwd)}, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr


def test_codex_exec_default_configuration(clis, server, tmp_path):
    env = sealed_env(tmp_path / "home")
    env["DFLASH2_KEY"] = "unused"
    provider = (f'model_providers.dflash2={{name="dflash2",base_url="{server.url}/v1",wire_api="responses",'
                f'env_key="DFLASH2_KEY"}}')
    code, out, err = run([clis["codex"], "exec", "--json", "--skip-git-repo-check", "-c", provider,
                          "-c", "model_provider=dflash2", "-c", "model_context_window=65536",
                          "-m", "lookalike", PROMPT], env, tmp_path)
    assert code == 0, (out + err)[-3000:]
    events = json_lines(out)
    messages = [e["item"]["text"] for e in events
                if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "agent_message"]
    usage = [e["usage"] for e in events if e.get("type") == "turn.completed"]
    assert messages and messages[-1].strip() == ANSWER.strip(), events[-5:]
    assert usage and usage[-1]["output_tokens"] > 0 and usage[-1]["input_tokens"] > 5000, usage


def test_claude_print_default_configuration(clis, server, tmp_path):
    env = sealed_env(tmp_path / "home")
    env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="unused")
    code, out, err = run([clis["claude"], "-p", PROMPT, "--model", "lookalike", "--output-format", "json"],
                         env, tmp_path)
    assert code == 0, (out + err)[-3000:]
    result = json_lines(out)[-1]
    assert result["type"] == "result" and result["subtype"] == "success" and not result["is_error"], result
    assert result["result"].strip() == ANSWER.strip(), result
    assert result["usage"]["output_tokens"] > 0, result["usage"]
    read = result["usage"]["input_tokens"] + result["usage"]["cache_read_input_tokens"]
    assert read > 10000, result["usage"]  # its whole default prompt, tools and system prompt included


def test_opencode_run_default_configuration(clis, server, tmp_path):
    env = sealed_env(tmp_path / "home")
    config = {"$schema": "https://opencode.ai/config.json",
              "provider": {"dflash2": {"npm": "@ai-sdk/openai-compatible", "name": "dflash2",
                                       "options": {"baseURL": f"{server.url}/v1", "apiKey": "unused"},
                                       "models": {"lookalike": {"name": "look-alike",
                                                                "limit": {"context": 65536, "output": 4096}}}}}}
    (tmp_path / "opencode.json").write_text(json.dumps(config))
    code, out, err = run([clis["opencode"], "run", "-m", "dflash2/lookalike", "--format", "json", PROMPT],
                         env, tmp_path)
    assert code == 0, (out + err)[-3000:]
    events = json_lines(out)
    texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
    finished = [e["part"]["tokens"] for e in events if e.get("type") == "step_finish"]
    assert texts and texts[-1].strip() == ANSWER.strip(), events[-5:]
    assert finished and finished[-1]["output"] > 0 and finished[-1]["input"] > 5000, finished
    assert not [e for e in events if e.get("type") == "error"], events


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTURED.glob("*.json")))
def test_captured_first_requests_are_answered(server, name):
    """The real clients' first requests, as they sent them (each was refused before issue 47:
    Codex's namespace and web_search tools, Claude Code's role "system" message), streamed as
    sent; every event is validated by the official SDK's types and the answer is the model's."""
    spec = json.loads((CAPTURED / name).read_text())
    path = spec["path"].split("?")[0]
    events = post_sse(server.url + spec["path"], spec["headers"], {**spec["body"], "model": "lookalike"})
    if path == "/v1/responses":
        parsed = [validate_event(RESPONSES_EVENTS, RESPONSES_EVENT, json.loads(data)) for _, data in events]
        done = Response.model_validate(parsed[-1].response.model_dump(), strict=True)
        assert parsed[-1].type == "response.completed" and done.output_text == ANSWER
    elif path == "/v1/messages":
        parsed = [validate_event(ANTHROPIC_EVENTS, ANTHROPIC_EVENT, json.loads(data)) for _, data in events]
        assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop"
        Message.model_validate(parsed[0].message.model_dump(), strict=True)
        text = "".join(e.delta.text for e in parsed if e.type == "content_block_delta" and e.delta.type == "text_delta")
        assert text == ANSWER
    else:
        chunks = [ChatCompletionChunk.model_validate(json.loads(data), strict=True) for _, data in events
                  if data != "[DONE]"]
        assert events[-1][1] == "[DONE]"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER


# -- dflash2 launch ---------------------------------------------------------------------------

def launch(clis, tmp_path, *args, timeout=600):
    env = sealed_env(tmp_path / "home")
    env["PATH"] = f"{Path(clis['codex']).parent}:{env['PATH']}"
    done = subprocess.run([sys.executable, "-m", "dflash2_mlx.cli", "launch", *args], env={**env, "PWD": str(tmp_path)},
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("client,args", [
    ("codex", ["exec", "--json", "--skip-git-repo-check", PROMPT]),
    ("claude", ["-p", PROMPT, "--output-format", "json"]),
    ("opencode", ["run", "--format", "json", PROMPT]),
])
def test_launch_starts_a_server_runs_the_client_and_stops_the_server(clis, server, tmp_path, client, args):
    model = server.model_folder  # the same look-alike, served anew by launch on a port of its own
    code, out, err = launch(clis, tmp_path, client, "--model", str(model), "--ar", "--port", str(free_port()),
                            "--", *args)
    assert code == 0, (out + err)[-3000:]
    assert "starting dflash2 serve" in err and ANSWER.strip() in out, (out + err)[-3000:]
    assert not [line for line in err.splitlines() if "Traceback" in line]
    log = err.split("its log: ")[1].split(")")[0]  # the private folder went with the server
    assert not Path(log).exists()


def test_launch_reuses_the_server_already_serving_the_model(clis, server, tmp_path):
    code, out, err = launch(clis, tmp_path, "claude", "--model", "lookalike", "--port", str(server.port), "--",
                            "-p", PROMPT, "--output-format", "json")
    assert code == 0, (out + err)[-3000:]
    assert f"using the dflash2 server already serving lookalike on {server.url}" in err
    assert json_lines(out)[-1]["result"].strip() == ANSWER.strip()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # still serving: not launch's to stop


def test_launch_says_in_one_line_when_the_context_is_too_small(clis, tmp_path):
    code, out, err = launch(clis, tmp_path, "claude", "--model", "builtin", "--ar", "--port", str(free_port()))
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == ["error: this model's context (2,048 tokens) is smaller than claude's default prompt (about "
                     "21,000 tokens): use a model with a longer context, or shrink the prompt with --system-prompt "
                     "TEXT and --tools NAMES (e.g. --tools Bash,Read)"], err


# -- a tool call issued by the model, run by the client, its result sent back ------------------

# What each client's shell tool is called and takes (their default tool lists, as captured).
CALLS = {"codex": {"name": "exec_command", "arguments": {"cmd": "pwd"}},
         "claude": {"name": "Bash", "arguments": {"command": "pwd"}},
         "opencode": {"name": "bash", "arguments": {"command": "pwd"}}}


def round_trip(client, clis, url, tmp_path):
    """(exit status, the tool's output the client reports, the answer after it) of one session."""
    env = sealed_env(tmp_path / "home")
    ask = "Show the working directory."
    if client == "codex":
        env["DFLASH2_KEY"] = "unused"
        provider = (f'model_providers.dflash2={{name="dflash2",base_url="{url}/v1",wire_api="responses",'
                    f'env_key="DFLASH2_KEY"}}')
        code, out, err = run([clis["codex"], "exec", "--json", "--skip-git-repo-check", "-c", provider,
                              "-c", "model_provider=dflash2", "-m", "lookalike", ask], env, tmp_path)
        events = [e.get("item", {}) for e in json_lines(out) if e.get("type") == "item.completed"]
        ran = [e["aggregated_output"] for e in events if e.get("type") == "command_execution" and e["exit_code"] == 0]
        said = [e["text"] for e in events if e.get("type") == "agent_message"]
    elif client == "claude":
        env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="unused")
        code, out, err = run([clis["claude"], "-p", ask, "--model", "lookalike", "--allowedTools", "Bash",
                              "--output-format", "stream-json", "--verbose"], env, tmp_path)
        blocks = [b for e in json_lines(out) if e.get("type") in ("assistant", "user") for b in e["message"]["content"]]
        ran = [b["content"] for b in blocks if b.get("type") == "tool_result" and not b.get("is_error")]
        said = [b["text"] for b in blocks if b.get("type") == "text"]
    else:
        config = {"provider": {"dflash2": {"npm": "@ai-sdk/openai-compatible", "name": "dflash2",
                                           "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
                                           "models": {"lookalike": {"name": "look-alike"}}}}}
        (tmp_path / "opencode.json").write_text(json.dumps(config))
        code, out, err = run([clis["opencode"], "run", "-m", "dflash2/lookalike", "--format", "json", ask], env, tmp_path)
        parts = [e["part"] for e in json_lines(out) if "part" in e]
        ran = [p["state"]["output"] for p in parts if p.get("type") == "tool" and p["state"].get("status") == "completed"]
        said = [p["text"] for p in parts if p.get("type") == "text"]
    return code, out + err, ran, said


@pytest.mark.parametrize("client", sorted(CALLS))
def test_a_tool_call_reaches_the_client_and_its_result_comes_back(clis, tmp_path, client):
    """The look-alike answers any prompt with a call of the client's own shell tool (`pwd`) and a
    tool's result with its sentence: the client must run the call, send the result back in the
    same session and report the answer that followed it."""
    model = fixed_answer_lookalike(tmp_path / "lookalike", call=CALLS[client])
    for server in serving("--model", str(model), "--ar", "--served-model-name", "lookalike", tmp=tmp_path):
        code, output, ran, said = round_trip(client, clis, server.url, tmp_path)
        assert code == 0, output[-3000:]
        assert [r.strip() for r in ran] == [str(tmp_path)], output[-3000:]  # pwd ran, in the session's folder
        assert said and said[-1].strip() == ANSWER.strip(), output[-3000:]
