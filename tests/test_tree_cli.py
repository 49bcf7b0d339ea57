"""`--tree N` through the commands: generate's stats, bench's tree modes, one-line errors."""

import json

import pytest

from helpers import drafter_folder, target_folder


def _generate(cli, *extra):
    return cli(["generate", "--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2"),
                "-p", "def add(a, b):", "-m", 12, "--ignore-chat-template", "--json", *extra])


def test_generate_with_a_tree_is_the_ar_output_and_counts_its_rows(cli):
    code, out, err = _generate(cli, "--tree", 6)
    assert code == 0, err
    tree = json.loads(out)
    code, out, err = _generate(cli, "--ar")
    assert code == 0, err
    assert tree["token_ids"] == json.loads(out)["token_ids"]
    s = tree["stats"]
    # Every pass after the prefill ran the 6-row tree; τ per row is committed tokens over those rows.
    assert s["tree_rows"] == 6 and s["verify_rows"] == 6 * s["target_passes"]
    assert s["tau_per_verify_row"] == pytest.approx((s["generation_tokens"] - 1) / s["verify_rows"])


def test_bench_sweeps_tree_rows_beside_the_chain(cli, tmp_path):
    md = tmp_path / "bench.md"
    code, out, err = cli(["bench", "--model", target_folder("qwen3"), "--drafter", drafter_folder("qwen3", "dflash2"),
                          "--suite", "code", "--max-prompts", 1, "--block-sizes", "4", "--tree", "4,8",
                          "--repeats", 1, "-m", 8, "--json", "-", "--markdown", md])
    assert code == 0, err
    record = json.loads(out)
    configs = {(r["mode"], r["block_size"]) for r in record["runs"]}
    assert configs == {("ar", 1), ("mlx-lm", 1), ("dflash2", 4), ("dflash2-tree", 4), ("dflash2-tree", 8)}
    assert all(r["identical_to_ar"] for r in record["runs"] if r["mode"] != "ar")
    assert "| DFlash 2 tree | 8 |" in md.read_text()


@pytest.mark.parametrize("argv, fragment", [
    (["generate", "--tree", "1"], "--tree 1"),
    (["generate", "--tree", "-2"], "--tree -2"),
    (["bench", "--tree", "8,x"], "--tree '8,x'"),
])
def test_bad_tree_is_one_line_error(cli, argv, fragment):
    code, out, err = cli(argv + ["--model", target_folder("qwen3"), "-p", "x"] if argv[0] == "generate"
                         else argv + ["--model", target_folder("qwen3")])
    assert code == 1 and out == "" and fragment in err.splitlines()[-1] and "Traceback" not in err
