"""`dflash2 doctor`: flags each deliberately broken pairing and the fp16
activation trap, refuses near-zero acceptance (and accepts with a lower
--min-acceptance), estimates memory from headers before loading anything and
gets it right, and fails in one line."""

import json
from pathlib import Path

import pytest
from mlx.utils import tree_flatten

from dflash2_mlx.tools import doctor as doc
from dflash2_mlx.cli import ui
from dflash2_mlx.tools.synthetic import drafter_config_dict, write_drafter, write_target
from helpers import drafter_folder, target_config, target_folder


def run_json(cli, *argv, expect_code=None):
    code, out, err = cli(["doctor", "--json", *argv])
    assert out.strip(), err  # a record on stdout, whatever the verdict
    record = json.loads(out)
    assert code == (0 if record["ok"] else 1), err
    if expect_code is not None:
        assert code == expect_code, err
    if code:
        assert err.startswith("error: doctor refuses this setup: ") and err.count("\n") == 1
    statuses = {(s["title"], f["name"]): f["status"] for s in record["sections"] for f in s["findings"]}
    return record, statuses, err


def pair_argv(target=None, drafter=None):
    return ["--model", target or target_folder("qwen3"), "--drafter", drafter or drafter_folder("qwen3", "dflash2")]


COMPAT = "Target/drafter compatibility"
COSTS = "Decode costs (--block-size auto)"


def test_a_good_pair_passes_when_acceptance_is_not_required(cli):
    record, statuses, _ = run_json(cli, *pair_argv(), "--min-acceptance", "0", expect_code=0)
    titles = [s["title"] for s in record["sections"]]
    assert titles == ["MLX", "Memory (estimated before loading)", "Quantization", COMPAT, "Acceptance self-test",
                      COSTS]
    assert all(v == "ok" for (t, _), v in statuses.items() if t == COMPAT)
    # What a split over ranks promises for this target's dtype (float32 here), beside the exactness verdict.
    assert statuses[("Acceptance self-test", "over ranks")] == "info"
    over = next(f for s in record["sections"] if s["title"] == "Acceptance self-test" for f in s["findings"]
                if f["name"] == "over ranks")
    assert "token-identical to one process" in over["message"]
    # The table --block-size auto decides with: a plain step and a cycle per measured block size,
    # at a short and a long context, and what they become further out.
    costs = record["sections"][-1]["data"]
    tables = costs["costs"]["by_context"]
    assert len(tables) == 2
    for table in tables.values():
        assert table["plain_s"] > 0 and set(table["cycle_s"]) >= {"2", "16"}
    assert (COSTS, "block 2") in statuses and (COSTS, "auto") in statuses
    # ... and at the end of the target's context.
    limit = json.loads((Path(target_folder("qwen3")) / "config.json").read_text())["max_position_embeddings"]
    assert {(COSTS, f"{n} tokens") for n in (*map(int, tables), limit)} <= set(statuses)
    # A batched cycle's cost against the total rows in it, and what the batch policy would run.
    batch = costs["batch"]
    assert set(batch["target_s"]) == {"1", "2", "4", "8", "16", "32", "64"} and batch["overhead_s"] >= 0
    assert {(COSTS, "1 row"), (COSTS, "64 rows"), (COSTS, "batch by context"), (COSTS, "batch policy")} <= set(statuses)
    assert statuses[("Acceptance self-test", "parity")] == "ok"
    kernels = record["sections"][0]["data"]["kernels"]
    assert set(kernels) == {"two_tap_conv", "path_select"} and set(kernels.values()) <= {"kernel", "twin"}


def test_near_zero_acceptance_is_refused(cli):
    record, statuses, err = run_json(cli, *pair_argv(), expect_code=1)
    assert statuses[("Acceptance self-test", "acceptance")] == "fail"
    data = record["sections"][-1]["data"]
    assert data["first_position_acceptance"] < 0.2 and data["min_acceptance"] == 0.2
    assert "first-position acceptance" in err and "below --min-acceptance 0.20" in err


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Drafters that do not fit the 4-layer, hidden-64, 384-row qwen3 target, one flaw each."""
    root = tmp_path_factory.mktemp("broken")
    good = target_config("qwen3")
    made = {}
    for name, cfg in {
        "layer ids": drafter_config_dict(good, target_layer_ids=[1, 9]),
        "mask": drafter_config_dict(good, mask_token_id=400),
        "num_target_layers": dict(drafter_config_dict(good), num_target_layers=8),
    }.items():
        made[name] = write_drafter(root / name.replace(" ", "_"), cfg)
    made["other target"] = write_target(root / "target32", "qwen3", hidden_size=32)
    return made


@pytest.mark.parametrize("flaw, failing", [
    ("hidden size", {"hidden_size", "fc_width"}),
    ("layer ids", {"target_layer_ids"}),
    ("mask", {"mask_token_id"}),
    ("num_target_layers", {"num_target_layers"}),
])
def test_each_broken_pairing_is_flagged(cli, broken, flaw, failing):
    if flaw == "hidden size":
        argv = pair_argv(target=broken["other target"])
    else:
        argv = pair_argv(drafter=broken[flaw])
    record, statuses, err = run_json(cli, *argv, expect_code=1)
    failed = {name for (title, name), v in statuses.items() if title == COMPAT and v == "fail"}
    assert failed == failing
    assert record["sections"][-1]["title"] == COMPAT  # no self-test on an incompatible pair
    assert f"{COMPAT.lower()}: {sorted(failing)[0] if flaw != 'hidden size' else 'hidden_size'}" in err


def test_fp16_activation_trap_is_flagged(cli):
    record, statuses, err = run_json(cli, *pair_argv(), "--draft-quant", "w4a16", "--min-acceptance", "0",
                                     expect_code=1)
    assert statuses[("Quantization", "draft activations")] == "fail"
    assert "fp16 activations" in err and "w4a32:gs64" in err
    _, statuses, _ = run_json(cli, *pair_argv(), "--draft-quant", "w4a32", "--min-acceptance", "0", expect_code=0)
    assert statuses[("Quantization", "draft activations")] == "ok"


def test_saved_fp16_drafter_is_flagged(cli, tmp_path):
    out = tmp_path / "q16"
    code, _, err = cli(["quantize", "--drafter", drafter_folder("qwen3", "dflash2"), "-q", "w8a16", "--out", out])
    assert code == 0, err
    _, statuses, _ = run_json(cli, *pair_argv(drafter=out), "--no-self-test", expect_code=1)
    assert statuses[("Quantization", "saved drafter activations")] == "fail"


# -- memory ------------------------------------------------------------------------------------


def test_memory_estimate_comes_before_loading_and_is_right(monkeypatch):
    from dflash2_mlx.loading import checkpoints as loading

    loads = []
    real = loading.load_target
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: loads.append(1) or real(*a, **k))
    sections = doc.run_doctor(str(target_folder("qwen3")), str(drafter_folder("qwen3", "dflash2")),
                              context=1000, run_self_test=False)
    titles = []
    for section in sections:
        titles.append(section.title)
        if section.title.startswith("Memory"):
            memory = section.data
            assert not loads  # estimated from config.json and safetensors headers alone
    assert loads and titles[-1] == COMPAT
    target, _ = real(str(target_folder("qwen3")))
    actual = sum(v.nbytes for _, v in tree_flatten(target.model.parameters()))
    assert memory["target_weights_gb"] * 1e9 == pytest.approx(actual)
    cfg = target_config("qwen3")  # fp32 on the CPU: 4 bytes
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4 * 1000
    assert memory["target_kv_gb"] * 1e9 == pytest.approx(kv)
    assert memory["drafter_kv_gb"] > 0 and memory["total_gb"] == pytest.approx(
        sum(v for k, v in memory.items() if k.endswith("_gb") and k != "total_gb" and k != "device_memory_gb"))


def test_quantized_drafter_estimate_is_smaller():
    from dflash2_mlx.loading.quantize import DraftQuant

    folder = drafter_folder("qwen3", "dflash2")
    full = doc.weight_bytes(folder, 4)
    assert doc.weight_bytes(folder, 4, DraftQuant.parse("w4a32:gs32")) < full / 3


def test_hybrid_and_sliding_kv_estimates():
    full = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}
    per_token = doc.kv_bytes_per_token(full, 2, context=1000)
    assert per_token == 2 * 4 * 2 * 16 * 2
    hybrid = dict(full, full_attention_interval=2)  # half the layers are recurrent
    assert doc.kv_bytes_per_token(hybrid, 2, context=1000) == per_token / 2
    sliding = dict(full, layer_types=["sliding_attention"] * 4, sliding_window=84)
    assert doc.kv_bytes_per_token(sliding, 2, context=1000) == pytest.approx(per_token * 100 / 1000)


# -- rendering and errors ------------------------------------------------------------------------


def test_sections_render_with_marks():
    section = doc.Section("Checks", (doc.Finding("a", "ok", "fine"), doc.Finding("b", "fail", "broken"),
                                     doc.Finding("c", "warn", "hmm")))
    console = ui.make_console(width=100, record=True)
    console.print(ui.doctor_section(section))
    console.print(ui.doctor_summary(doc.problems([section])))
    text = console.export_text()
    assert "✓  a" in text and "✗  b" in text and "!  c" in text and "broken" in text
    assert "1 problem(s) found" in text


def test_text_output(cli):
    code, out, err = cli(["doctor", *pair_argv(), "--min-acceptance", "0"])
    assert code == 0, err
    for fragment in ("MLX", "kernel two_tap_conv", "Memory (estimated before loading)", "target KV cache",
                     "drafter weights", "hidden_size", "mask_token_id", "Acceptance self-test", "all checks passed"):
        assert fragment in out, fragment


def test_help(cli):
    code, out, _ = cli(["doctor", "--help"])
    assert code == 0 and "before loading" in out
    for flag in ("--model", "--drafter", "--draft-quant", "--context", "--min-acceptance", "--no-self-test",
                 "--block-size", "--json"):
        assert flag in out, flag


@pytest.mark.parametrize("extra, code, fragment", [
    (["--bogus"], 2, "--bogus"),
    (["--min-acceptance", "2"], 1, "--min-acceptance 2"),
    (["--context", "0"], 1, "--context 0"),
    (["--draft-quant", "w3b2"], 1, "w3b2"),
])
def test_bad_flags_are_one_line_errors(cli, extra, code, fragment):
    got, out, err = cli(["doctor", *pair_argv(), *extra])
    assert got == code and out == "" and err.startswith("error: ") and err.count("\n") == 1 and fragment in err


def test_missing_models_are_one_line_errors(cli):
    for argv, fragment in [(pair_argv(target="/nonexistent/target"), "does not exist"),
                           (pair_argv(drafter="/nonexistent/drafter"), "does not exist")]:
        code, out, err = cli(["doctor", *argv])
        assert code == 1 and err.startswith("error: doctor refuses this setup: models: find models: ")
        assert fragment in err and err.count("\n") == 1 and "Traceback" not in err
