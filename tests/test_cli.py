"""`dflash2 generate`: the JSON contract, text output, prompt handling, and one-line errors.

Most calls go through `dflash2_mlx.cli.main.main(argv)` in-process (the function the
`dflash2` entry point runs); a few run the installed `dflash2` command in a subprocess
to prove the entry point, stdin handling and that no traceback escapes.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dflash2_mlx.tools.synthetic import write_target
from cli_process import dflash2_command
from helpers import drafter_folder, target_folder

PROMPT = "Write a loop"
STATS_KEYS = {
    "prompt_tokens", "generation_tokens", "prompt_tps", "generation_tps", "target_passes",
    "mean_acceptance_length", "acceptance_by_position", "acceptance_histogram", "peak_memory_gb",
    "backend", "mode", "block_size",
}
RECORD_KEYS = {"text", "prompt_token_ids", "token_ids", "from_draft", "stats"}


@pytest.fixture(scope="module")
def paths():
    return dict(
        target=str(target_folder("qwen3")),
        drafter=str(drafter_folder("qwen3", "dflash2")),
        dflash=str(drafter_folder("qwen3", "dflash")),
    )


@pytest.fixture(scope="module")
def tokenizer(paths):
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(Path(paths["target"]))


@pytest.fixture
def gen(cli, paths):
    """gen(*flags, prompt=PROMPT, stdin=None) runs `dflash2 generate --json` on the tiny
    pair and returns the parsed record (asserting success and exactly one JSON object)."""

    def call(*flags, prompt=PROMPT, stdin=None, model=None, max_tokens=12):
        argv = ["generate", "--model", model or paths["target"], "--drafter", paths["drafter"],
                "-p", prompt, "-m", max_tokens, "--json", *flags]
        code, out, err = cli(argv, stdin)
        assert code == 0, err
        return parse_one_json(out)

    return call


def parse_one_json(out: str) -> dict:
    assert out.endswith("\n") and out.count("\n") == 1, out  # one line
    record, end = json.JSONDecoder().raw_decode(out)
    assert out[end:] == "\n"  # nothing after the object
    assert isinstance(record, dict)
    return record


def assert_one_line_error(code, out, err, expected_code=1):
    assert code == expected_code, (code, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "internal error" not in err  # user mistakes are known errors, not bugs
    assert err.endswith("\n")
    assert out == ""  # nothing half-generated on stdout


# -- the JSON record --------------------------------------------------------------------


def test_json_contract(gen, tokenizer):
    r = gen()
    assert RECORD_KEYS <= set(r)
    s = r["stats"]
    assert STATS_KEYS <= set(s), STATS_KEYS - set(s)
    n = len(r["token_ids"])
    assert n == 12 == s["generation_tokens"]
    assert len(r["from_draft"]) == n and all(isinstance(f, bool) for f in r["from_draft"])
    assert all(isinstance(t, int) for t in r["token_ids"] + r["prompt_token_ids"])
    assert s["prompt_tokens"] == len(r["prompt_token_ids"])
    assert r["text"] == tokenizer.decode(r["token_ids"])
    assert (s["backend"], s["mode"], s["block_size"]) == ("cpu", "dflash2", 16)
    assert len(s["acceptance_histogram"]) == 16 and sum(s["acceptance_histogram"]) == s["target_passes"]
    assert len(s["acceptance_by_position"]) == 15
    assert all(0.0 <= p <= 1.0 for p in s["acceptance_by_position"])
    assert s["mean_acceptance_length"] == pytest.approx((n - 1) / s["target_passes"])
    for key in ("prompt_tps", "generation_tps", "peak_memory_gb"):
        assert isinstance(s[key], float) and s[key] > 0


def test_greedy_dflash2_equals_ar(gen, paths):
    prompt = "    for i in range(10):\n        total +="
    ar = gen("--ar", prompt=prompt, max_tokens=30)
    assert ar["stats"]["mode"] == "ar" and not any(ar["from_draft"])
    for flags, mode in [((), "dflash2"), (("--block-size", "3"), "dflash2"),
                        (("--draft-model", paths["dflash"], "--block-size", "5"), "dflash")]:
        spec = gen(*flags, prompt=prompt, max_tokens=30)
        assert spec["token_ids"] == ar["token_ids"], flags
        assert spec["text"] == ar["text"] and spec["prompt_token_ids"] == ar["prompt_token_ids"]
        assert spec["stats"]["mode"] == mode


def test_seeded_sampling_is_reproducible(gen):
    a = gen("--temp", "0.8", "--seed", "3", "--top-k", "50")
    assert gen("--temperature", "0.8", "--seed", "3", "--top-k", "50")["token_ids"] == a["token_ids"]


# -- prompts -----------------------------------------------------------------------------


def test_prompt_dash_reads_stdin(gen):
    from_stdin = gen(prompt="-", stdin=PROMPT)
    direct = gen()
    assert from_stdin["prompt_token_ids"] == direct["prompt_token_ids"]
    assert from_stdin["token_ids"] == direct["token_ids"]
    other = gen(prompt="-", stdin="something else entirely")
    assert other["prompt_token_ids"] != direct["prompt_token_ids"]


def test_chat_template_and_ignore_chat_template(gen, tokenizer):
    templated = gen()
    raw = gen("--ignore-chat-template")
    assert templated["prompt_token_ids"] != raw["prompt_token_ids"]
    assert raw["prompt_token_ids"] == tokenizer.encode(PROMPT)
    assert tokenizer.decode(templated["prompt_token_ids"]) == (
        f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_system_prompt_is_rendered(gen, tokenizer):
    r = gen("--system-prompt", "Be brief.")
    assert tokenizer.decode(r["prompt_token_ids"]) == (
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    raw = gen("--system-prompt", "Be brief.", "--ignore-chat-template")
    assert tokenizer.decode(raw["prompt_token_ids"]) == f"Be brief.\n\n{PROMPT}"


@pytest.fixture(scope="module")
def thinking_target(paths, tmp_path_factory):
    """The tiny target with a chat template that reads `enable_thinking` (as Qwen3's does)."""
    folder = tmp_path_factory.mktemp("thinking") / "target"
    shutil.copytree(paths["target"], folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] += "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    config_path.write_text(json.dumps(config))
    return str(folder)


def test_chat_template_config_reaches_the_template(gen, tokenizer, thinking_target):
    plain = gen()  # the default synthetic template ignores the option but accepts it
    same = gen("--chat-template-config", '{"enable_thinking": false}')
    assert (same["prompt_token_ids"], same["token_ids"]) == (plain["prompt_token_ids"], plain["token_ids"])
    off = gen("--chat-template-config", '{"enable_thinking": false}', model=thinking_target)
    # (mlx-lm passes enable_thinking = has_thinking when it is not given, so say it explicitly.)
    on = gen("--chat-template-config", '{"enable_thinking": true}', model=thinking_target)
    assert tokenizer.decode(off["prompt_token_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tokenizer.decode(on["prompt_token_ids"]).endswith("<|im_start|>assistant\n")


# -- text output ---------------------------------------------------------------------------

CLOSING = [
    r"Prompt: (\d+) tokens, \d+\.\d+ tokens-per-sec",
    r"Generation: (\d+) tokens, \d+\.\d+ tokens-per-sec",
    r"Peak memory: \d+\.\d+ GB",
]
ACCEPTANCE = (
    r"draft acceptance = (\d+\.\d+) \((\d+) accepted / (\d+) drafted\), "
    r"mean acceptance length = (\d+\.\d+), acceptance rate per position = \(([^)]*)\)"
)


@pytest.mark.parametrize("mode", ["dflash2", "ar"])
def test_text_mode_streams_then_prints_closing_lines(cli, gen, paths, mode):
    flags = ["--block-size", "4"] if mode == "dflash2" else ["--ar"]
    record = gen(*flags, max_tokens=20)
    code, out, err = cli(["generate", "--model", paths["target"], "--drafter", paths["drafter"],
                          "-p", PROMPT, "-m", 20, *flags])
    assert code == 0 and "error" not in err
    assert out.startswith(record["text"])  # the streamed text, exactly, comes first
    lines = out[len(record["text"]):].split("\n")
    found = {}
    for pattern in CLOSING + [ACCEPTANCE]:
        hits = [re.fullmatch(pattern, line) for line in lines]
        hits = [h for h in hits if h]
        found[pattern] = hits[0] if hits else None
    prompt_line, gen_line, mem_line = (found[p] for p in CLOSING)
    assert prompt_line and int(prompt_line[1]) == len(record["prompt_token_ids"])
    assert gen_line and int(gen_line[1]) == 20
    assert mem_line
    assert lines.index(prompt_line[0]) < lines.index(gen_line[0]) < lines.index(mem_line[0])
    acc = found[ACCEPTANCE]
    if mode == "ar":
        assert acc is None and "draft acceptance" not in out
        return
    assert acc, out
    s = record["stats"]
    accepted, drafted = int(acc[2]), int(acc[3])
    assert (accepted, drafted) == (s["accepted"], s["drafted"]) and drafted >= 3 * (s["target_passes"] - 1)
    assert float(acc[1]) == pytest.approx(accepted / drafted, abs=0.005)
    assert float(acc[4]) == pytest.approx(s["mean_acceptance_length"], abs=0.005)
    rates = [float(x) for x in acc[5].split(", ")]
    assert rates == pytest.approx(s["acceptance_by_position"], abs=0.005) and len(rates) == 3


# -- errors ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_size_target(tmp_path_factory):
    """A target with hidden size 32: the tiny drafters were made for hidden size 64."""
    return str(write_target(tmp_path_factory.mktemp("other") / "target", "qwen3", hidden_size=32))


BAD_INPUT = {
    "unknown local target": (["--model", "/nonexistent/target-folder"], None, 1, "does not exist"),
    "unknown local drafter": (["--drafter", "./no/such/drafter"], None, 1, "does not exist"),
    "block size 1": (["--block-size", "1"], None, 1, "--block-size 1"),
    "block size above checkpoint": (["--block-size", "17"], None, 1, "block_size 16"),
    "negative temp": (["--temp", "-0.5"], None, 1, "negative"),
    "top-p 0": (["--top-p", "0"], None, 1, "top_p"),
    "top-p above 1": (["--top-p", "1.5"], None, 1, "top_p"),
    "empty prompt": (["-p", ""], None, 1, "empty"),
    "whitespace stdin": (["-p", "-"], "  \n\t \n", 1, "empty"),
    "unknown flag": (["--bogus"], None, 2, "--bogus"),
    "non-integer max-tokens": (["--max-tokens", "ten"], None, 2, "max-tokens"),
    "max-tokens 0": (["--max-tokens", "0"], None, 1, "max-tokens"),
    "bad draft-quant": (["--draft-quant", "w4b32"], None, 1, "w4b32"),
    "invalid template json": (["--chat-template-config", "{enable_thinking: false"], None, 1, "JSON"),
    "template json not an object": (["--chat-template-config", "[1, 2]"], None, 1, "JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_error(cli, paths, case):
    extra, stdin, code, fragment = BAD_INPUT[case]
    argv = ["generate", "--model", paths["target"], "--drafter", paths["drafter"], "-p", "hi", "-m", 4]
    got, out, err = cli(argv + extra, stdin)
    assert_one_line_error(got, out, err, expected_code=code)
    assert fragment in err


@pytest.mark.parametrize("command", ["generate", "chat", "compare", "bench"])
@pytest.mark.parametrize("drafter", [None, "/nonexistent/drafter"])
def test_missing_model_is_reported_first(cli, command, drafter):
    """A --model that is not there is the first thing to fix: reported before a
    missing drafter, and before "no drafter given" (which would send the user
    looking for a drafter when the target path is the typo)."""
    argv = [command, "--model", "/nonexistent/target"] + (["--drafter", drafter] if drafter else [])
    code, out, err = cli(argv + (["-p", "hi"] if command in ("generate", "compare") else []))
    assert_one_line_error(code, out, err)
    assert err == "error: target folder '/nonexistent/target' does not exist\n"


def test_no_prompt_is_one_line_error(cli, paths):
    code, out, err = cli(["generate", "--model", paths["target"], "--drafter", paths["drafter"]])
    assert_one_line_error(code, out, err)
    assert "--prompt" in err


def test_incompatible_drafter_is_one_line_error(cli, paths, other_size_target):
    code, out, err = cli(["generate", "--model", other_size_target, "--drafter", paths["drafter"], "-p", "hi"])
    assert_one_line_error(code, out, err)
    assert "incompatible" in err and "hidden_size" in err
    # The same target is fine on its own.
    code, out, err = cli(["generate", "--model", other_size_target, "--ar", "-p", "hi", "-m", 3, "--json"])
    assert code == 0 and parse_one_json(out)["stats"]["mode"] == "ar"


def test_help(cli):
    code, out, _ = cli(["--help"])
    assert code == 0 and "generate" in out
    code, out, _ = cli(["generate", "--help"])
    assert code == 0
    for flag in ("--model", "--drafter", "--draft-model", "--prompt", "--max-tokens", "--temp",
                 "--top-p", "--top-k", "--min-p", "--seed", "--block-size", "--draft-quant",
                 "--system-prompt", "--ignore-chat-template", "--chat-template-config", "--ar", "--json"):
        assert flag in out, flag


def test_every_option_has_its_own_help():
    """Every option of every command says what it does, and no two options of
    one command share a help text (a copied line describes at most one of them)."""
    import typer

    from dflash2_mlx.cli.main import app

    def commands(cmd, name):
        yield name, cmd
        for sub, child in getattr(cmd, "commands", {}).items():
            yield from commands(child, f"{name} {sub}")

    missing, shared = [], []
    for name, cmd in commands(typer.main.get_command(app), "dflash2"):
        seen = {}
        for param in cmd.params:
            if param.param_type_name != "option":
                continue
            text = " ".join((param.help or "").split())
            if not text:
                missing.append(f"{name} {param.opts[0]}")
            elif text in seen:
                shared.append(f"{name}: {seen[text]} and {param.opts[0]}")
            seen.setdefault(text, param.opts[0])
    assert not missing, f"options without help: {missing}"
    assert not shared, f"options sharing one help text: {shared}"


# -- the installed entry point ---------------------------------------------------------------


def _dflash2(args, stdin=None, env=None):
    return subprocess.run([*dflash2_command(), *args], input=stdin, capture_output=True, text=True, env=env,
                          timeout=120)


def test_entry_point_json_from_stdin(gen, paths):
    p = _dflash2(["generate", "--model", paths["target"], "--drafter", paths["drafter"],
                  "--prompt", "-", "-m", "12", "--json"], stdin=PROMPT)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    record = parse_one_json(p.stdout)
    assert record["token_ids"] == gen()["token_ids"]


def test_entry_point_offline_hub_id_with_empty_cache(paths, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    p = _dflash2(["generate", "--model", "nobody-org/no-such-model", "--drafter", paths["drafter"],
                  "-p", "hi"], env=env)
    assert_one_line_error(p.returncode, p.stdout, p.stderr)
    assert "nobody-org/no-such-model" in p.stderr and "cache" in p.stderr


def test_entry_point_usage_error(paths):
    p = _dflash2(["generate", "--model", paths["target"], "--drafter", paths["drafter"], "-p", "hi",
                  "--max-tokens", "ten"])
    assert_one_line_error(p.returncode, p.stdout, p.stderr, expected_code=2)
    assert "--max-tokens" in p.stderr
