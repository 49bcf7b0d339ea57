"""A first answer does not wait for the full calibration (engine/plan.py: calibration_for,
adaptive/calibrate.py: first_estimate): with nothing cached, a front end that asks for
`first` gets a first estimate (short context only, no rows sweep), kept as such and read
again by the next run; whoever asks for the full one (the doctor, the server) measures it
then, and it replaces the estimate."""

from dflash2_mlx.engine.adaptive.calibrate import read_calibration
from dflash2_mlx.engine.plan import calibration_for, plan
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.loading.load_pair import load_pair


def test_a_first_estimate_then_the_full_calibration(tmp_path):
    pair, tokenizer = load_pair("builtin", "builtin")
    ids = tokenizer.encode("def fib(n):")
    request = DecodeRequest(max_tokens=32)
    notes = []

    def measuring():
        notes.append("measuring")
        import contextlib

        return contextlib.nullcontext()

    first = calibration_for(pair, request, tmp_path, ids, first=True, measuring=measuring)
    assert not first.calibration.complete and first.calibration.batch is None
    assert len(first.calibration.costs.contexts) == 1  # the prompt's context only
    assert first.note and "first estimate" in first.note and notes == ["measuring"]
    assert not read_calibration(pair, tmp_path).complete  # kept as an estimate

    again = calibration_for(pair, request, tmp_path, ids, first=True, measuring=measuring)
    assert again.calibration.cached and notes == ["measuring"]  # read, not measured
    # The estimate drives auto like any calibration: a plan with its policy.
    assert plan(pair, request, again.calibration, prompt_ids=ids).auto

    full = calibration_for(pair, request, tmp_path, ids, measuring=measuring)
    assert full.calibration.complete and full.calibration.batch is not None and notes == ["measuring"] * 2
    assert read_calibration(pair, tmp_path).complete  # the full one replaced the estimate
    later = calibration_for(pair, request, tmp_path, ids, first=True, measuring=measuring)
    assert later.calibration.complete and notes == ["measuring"] * 2
