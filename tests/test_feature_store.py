"""The training feature store: what it gives back is what the target computes,
it is read instead of the target once filled, and its key follows what the
features depend on. Also: --target-layers, and the float weights a CPU run
trains against."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from dflash2_mlx.errors import DFlashError
from dflash2_mlx.train.forward import target_features
from dflash2_mlx.train.setup import float_weights, prepare
from dflash2_mlx.train.trainer import TrainConfig
from dflash2_mlx.loading.checkpoints import load_target
from helpers import target_folder
from test_train import DATA, SMALL


def trainer(out, store, **kw):
    cfg = TrainConfig(steps=4, batch_size=4, blocks_per_seq=4, lr=3e-3, eval_every=4, save_every=4)
    return prepare(str(target_folder("qwen3")), DATA, out, config=cfg, feature_store=str(store), **{**SMALL, **kw})


class NoTarget:
    """Stands where the target was: any forward through it is an error."""

    def __call__(self, *a, **k):
        raise AssertionError("the target ran although the store holds these rows")


def test_stored_features_are_the_target_s_own(tmp_path):
    t = trainer(tmp_path / "run", tmp_path / "store")
    store = t.stores[id(t.sequences)]
    rows = np.array([3, 0, 5])
    got = store.features(rows)
    want = target_features(t.target, mx.array(t.sequences[rows]), t.pair.layer_ids)
    assert got.shape == want.shape
    # float16 storage: equal to half precision, no more
    assert np.allclose(np.array(got), np.array(want), rtol=2e-3, atol=2e-3)
    assert store.filled == 3 and list(np.flatnonzero(store.done)) == [0, 3, 5]


def test_a_second_run_reads_the_store_instead_of_the_target(tmp_path):
    first = trainer(tmp_path / "a", tmp_path / "store")
    for _ in first.run():
        pass
    first_store = first.stores[id(first.sequences)]
    filled = np.flatnonzero(first_store.done)
    assert len(filled) > 0
    second = trainer(tmp_path / "b", tmp_path / "store", kind="dflash")  # another drafter, same data
    store = second.stores[id(second.sequences)]
    assert store.filled == len(filled)  # the same files, found by their key
    store.target = NoTarget()
    feats = store.features(filled[:2])
    assert np.array_equal(np.array(feats), np.array(first_store.features(filled[:2])))


def test_the_store_key_follows_layers_and_data(tmp_path):
    a = trainer(tmp_path / "a", tmp_path / "store", target_layer_ids=[1, 3])
    b = trainer(tmp_path / "b", tmp_path / "store", target_layer_ids=[1, 2])
    c = trainer(tmp_path / "c", tmp_path / "store", target_layer_ids=[1, 3], seq_len=48)
    names = {s.data.filename for t in (a, b, c) for s in t.stores.values()}
    assert len(names) == 6  # train and held-out, three different feature sets
    assert a.drafter_config["dflash_config"]["target_layer_ids"] == [1, 3]
    assert a.drafter.fc.weight.shape[1] == 2 * a.target.hidden_size


def test_a_quantized_target_trains_against_its_own_float_weights():
    target, _ = load_target(str(target_folder("qwen3", quantize_bits=4)), activation_dtype=mx.float32)
    tokens = mx.array([[5, 9, 2, 7, 1, 3, 8, 4]])
    before = target_features(target, tokens, [1, 2])
    float_weights(target)
    assert not any(hasattr(m, "bits") for _, m in target.model.named_modules())
    assert all(p.dtype == mx.float32 for _, p in tree_flatten(target.model.parameters()))
    after = target_features(target, tokens, [1, 2])
    assert np.allclose(np.array(before), np.array(after), rtol=1e-4, atol=1e-4)


class Added:
    def __init__(self, content, special=True):
        self.content, self.special = content, special

    def __str__(self):
        return self.content


class FullVocabTokenizer:
    """SmolLM2's case: every embedding row is a token; specials frame turns or are unused."""

    chat_template = "{{'<|im_start|>' + m['content'] + '<|im_end|>'}}"
    bos_token_id, eos_token_id, pad_token_id, unk_token_id = 1, 2, 2, 0
    added_tokens_decoder = {0: Added("<|endoftext|>"), 1: Added("<|im_start|>"), 2: Added("<|im_end|>"),
                            3: Added("<repo_name>"), 16: Added("<empty_output>"), 17: Added("!", special=False)}

    def get_vocab(self):
        return {f"t{i}": i for i in range(64)}


class FullTarget:
    embedding_rows = 64


def test_a_target_without_a_spare_row_masks_with_an_unused_special_token():
    from dflash2_mlx.train.setup import find_mask_token

    assert find_mask_token(FullTarget(), FullVocabTokenizer()) == 16
    tok = FullVocabTokenizer()
    tok.added_tokens_decoder = {i: t for i, t in tok.added_tokens_decoder.items() if i < 3}
    with pytest.raises(DFlashError, match="--mask-token-id"):
        find_mask_token(FullTarget(), tok)
