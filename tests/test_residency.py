"""engine/residency.py: the generation stream and mlx-lm's wired limit for a pair.

The CPU build reports no recommended working set, so there `wired_limit` must
leave the wired limit alone; the Metal path is driven here through a fake
`mx.device_info` that reports one (the real call is recorded, not made).
"""

import threading
import warnings

import mlx.core as mx
import mlx.nn as nn
import pytest

import dflash2_mlx.engine.residency as residency
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.residency import generation_stream, model_bytes, modules_of, wired_limit
from dflash2_mlx.engine.target.adapter import Target
from dflash2_mlx.loading.model_classes import model_classes
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, target_config


@pytest.fixture(scope="module")
def pair():
    cfg = target_config("qwen3", vocab_size=16, hidden_size=32, num_hidden_layers=2)
    model_cls, args_cls = model_classes(cfg)
    target = Target(model_cls(args_cls.from_dict(cfg)))
    dcfg = drafter_config_dict(cfg, "dflash2", num_layers=1, block_size=4, target_layer_ids=[0, 1], selector_top_k=4)
    dcfg["dflash_config"]["mask_token_id"] = 15
    return Pair.make(target, random_drafter(dcfg, seed=1))


def _nbytes(module):
    from mlx.utils import tree_flatten
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


# -- the stream ---------------------------------------------------------------------------------

def test_the_stream_runs_work_on_its_own_stream():
    with mx.stream(generation_stream):
        inside = mx.default_stream(mx.default_device())
        x = mx.arange(4) * 2
    assert inside != mx.default_stream(mx.default_device())
    mx.synchronize(generation_stream)
    assert x.tolist() == [0, 2, 4, 6]


def test_the_stream_works_on_another_thread():
    """The server decodes on a worker thread; a plain mx.new_stream made at import fails there."""
    out = []

    def work():
        try:
            with mx.stream(generation_stream):
                out.append((mx.arange(3) + 1).tolist())
            mx.synchronize(generation_stream)
        except Exception as e:  # noqa: BLE001 - the failure is what the test reports
            out.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == [[1, 2, 3]]


# -- what is counted --------------------------------------------------------------------------

def test_a_pair_counts_its_target_and_drafter(pair):
    assert modules_of(pair) == [pair.target.model, pair.drafter]
    assert modules_of(pair.target) == [pair.target.model]
    assert modules_of([pair.target.model, pair.drafter, pair.drafter]) == [pair.target.model, pair.drafter]
    assert model_bytes(pair) == _nbytes(pair.target.model) + _nbytes(pair.drafter) > 0
    assert modules_of(Pair(pair.target)) == [pair.target.model]


# -- no Metal: inert ----------------------------------------------------------------------------

def test_inert_without_a_recommended_working_set(pair, monkeypatch):
    if mx.device_info().get("max_recommended_working_set_size") is not None:
        pytest.skip("this device reports a recommended working set (Metal)")
    calls = []
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: calls.append(n) or 0)
    with wired_limit(pair, [generation_stream]):
        with mx.stream(generation_stream):
            y = mx.ones(3).sum()
    assert (calls, y.item()) == ([], 3.0)


# -- Metal (faked): wired, warned, restored ------------------------------------------------------

@pytest.fixture
def fake_metal(monkeypatch):
    """A device with a recommended working set; records set_wired_limit and synchronize."""
    state = {"limit": 7, "sets": [], "syncs": [], "size": 1 << 30}
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": state["size"]})

    def set_wired_limit(n):
        state["sets"].append(n)
        old, state["limit"] = state["limit"], n
        return old

    monkeypatch.setattr(mx, "set_wired_limit", set_wired_limit)
    monkeypatch.setattr(mx, "synchronize", lambda s=None: state["syncs"].append(s))
    return state


def test_wires_the_recommended_size_and_restores_it(pair, fake_metal):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a small pair: no warning
        with wired_limit(pair, [generation_stream]):
            assert fake_metal["limit"] == 1 << 30
            assert fake_metal["syncs"] == []
    assert fake_metal["sets"] == [1 << 30, 7]
    assert fake_metal["limit"] == 7
    assert fake_metal["syncs"] == [generation_stream]


def test_restores_after_an_error_and_syncs_everything_without_streams(pair, fake_metal):
    with pytest.raises(RuntimeError, match="boom"):
        with wired_limit([pair.target.model]):
            raise RuntimeError("boom")
    assert (fake_metal["limit"], fake_metal["syncs"]) == (7, [None])


def test_warns_when_the_models_are_close_to_the_limit(pair, fake_metal):
    size = model_bytes(pair)
    fake_metal["size"] = int(size / residency.CLOSE_TO_LIMIT) - 1
    with pytest.warns(UserWarning, match=f"need {size // 2**20} MB, close to the maximum recommended"):
        with wired_limit(pair):
            pass
    assert fake_metal["limit"] == 7
    fake_metal["size"] = int(size / residency.CLOSE_TO_LIMIT) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with wired_limit(pair):
            pass


def test_a_module_list_is_accepted(fake_metal):
    layer = nn.Linear(4, 4)
    with wired_limit([layer], []):
        pass
    assert fake_metal["sets"] == [1 << 30, 7] and fake_metal["syncs"] == []
