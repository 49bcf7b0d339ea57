"""Logit bias, penalties and log-probabilities inside speculation (engine/decode/rows.py).

The reference is mlx-lm's own plain decoding (`mlx_lm.generate.generate_step`)
with the same `make_logits_processors`: greedy DFlash / DFlash 2 with each
penalty and with a logit bias must give its tokens exactly (each verified row
penalised with its own prefix), and the log-probabilities reported for those
tokens must equal the ones mlx-lm returns (1e-5), with the same top tokens.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step as mlx_lm_generate_step
from mlx_lm.sample_utils import make_logits_processors

from dflash2_mlx import load_pair
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest

from helpers import decode_steps, load_pair_for

N = 48
SETTINGS = {
    "repetition": dict(repetition_penalty=1.5, repetition_context_size=16),
    "presence": dict(presence_penalty=1.2, presence_context_size=32),
    "frequency": dict(frequency_penalty=0.9, frequency_context_size=32),
    "bias": None,  # made from the plain answer: two of its tokens banned, one boosted
    "previous": None,  # made from the plain answer: `after_previous_token`
}


def after_previous_token(plain):
    """A logits processor that reads the previous token: after each token of the plain
    answer it bans the token that followed it there. A row processed with its prefix one
    token short bans the wrong token, and the greedy answer changes (it does not for
    the penalties above, which see nearly the same counts either way)."""
    follow = {}
    for prev, nxt in zip(plain, plain[1:]):
        follow.setdefault(prev, nxt)

    def processor(tokens, logits):
        banned = follow.get(int(tokens[-1].item()))
        if banned is None:
            return logits
        return mx.where(mx.arange(logits.shape[-1]) == banned, -mx.inf, logits)

    return processor


def processors_for(name, plain):
    if name == "previous":
        return [after_previous_token(plain)]
    return make_logits_processors(**(SETTINGS[name] or dict(logit_bias={plain[3]: -100.0, plain[12]: -100.0,
                                                                         plain[20]: 1.5})))


@pytest.fixture(scope="module")
def builtin():
    # fp32, as these logprobs were checked to 1e-5 against mlx-lm's (in bf16 mlx-lm rounds its own to bf16)
    return load_pair("builtin", "builtin", activation_dtype=mx.float32)


def reference(target, prompt, processors, n=N):
    tokens, logprobs = [], []
    for token, lp in mlx_lm_generate_step(mx.array(prompt), target.model, max_tokens=n,
                                          sampler=lambda x: mx.argmax(x, axis=-1), logits_processors=processors):
        tokens.append(int(token))
        logprobs.append(np.array(lp, dtype=np.float32))
    return tokens, logprobs


def ours(pair, prompt, processors, n=N, **kw):
    request = DecodeRequest(**{"max_tokens": n, "logits_processors": processors, "block_size": None, **kw})
    steps = list(decode_steps(mx.array(prompt), pair, request))
    return [t for s in steps for t in s.tokens], [lp for s in steps for lp in (s.logprobs or ())], steps


@pytest.mark.parametrize("name", list(SETTINGS))
def test_greedy_with_each_processor_equals_penalised_plain_decoding(builtin, name):
    pair, tokenizer = builtin
    prompt = tokenizer.encode("def parse(line):\n    parts = line.split(")
    plain, _ = reference(pair.target, prompt, [])
    processors = processors_for(name, plain)
    want, _ = reference(pair.target, prompt, processors)
    assert want != plain  # the processor changes the answer: the check is not vacuous
    assert ours(pair.without_drafter(), prompt, processors)[0] == want
    for block in (16, 5):
        got, _, steps = ours(pair, prompt, processors, block_size=block)
        assert got == want, block
        assert sum(s.accepted for s in steps) > 0  # drafts were accepted under the penalty


@pytest.mark.parametrize("family,kind", [("qwen3", "dflash2"), ("llama", "dflash")])
def test_penalised_speculation_on_look_alike_families(family, kind):
    target, _, drafter = load_pair_for(family, kind)
    processors = make_logits_processors(repetition_penalty=1.4, logit_bias={5: 3.0})
    prompt = [17, 42, 99, 7, 250, 3]
    want, _ = reference(target, prompt, processors, 30)
    assert ours(Pair.make(target, drafter), prompt, processors, 30, block_size=6)[0] == want


def test_logprobs_equal_plain_decoding(builtin):
    pair, tokenizer = builtin
    processors = make_logits_processors(presence_penalty=0.5)
    prompt = tokenizer.encode("class Stack:\n    def push(self, item):\n")
    want, rows = reference(pair.target, prompt, processors)
    for use, kw in ((pair, dict(block_size=16)), (pair.without_drafter(), {})):
        got, logprobs, _ = ours(use, prompt, processors, top_logprobs=5, **kw)
        assert got == want and len(logprobs) == len(want)
        for token, row, lp in zip(want, rows, logprobs):
            assert abs(lp.logprob - row[token]) < 1e-5
            top = np.argsort(-row, kind="stable")[:5]
            assert [t for t, _ in lp.top] == top.tolist()
            np.testing.assert_allclose([v for _, v in lp.top], row[top], atol=1e-5)


def test_no_logprobs_unless_asked(builtin):
    pair, tokenizer = builtin
    _, logprobs, steps = ours(pair, tokenizer.encode("x = "), (), 8, block_size=4)
    assert logprobs == [] and all(s.logprobs is None for s in steps)


@pytest.mark.parametrize("rows", [8, 20])
def test_trees_with_a_penalty_and_logprobs_equal_plain_decoding(builtin, rows):
    pair, tokenizer = builtin
    processors = make_logits_processors(repetition_penalty=1.5, logit_bias={13: 2.0})
    prompt = tokenizer.encode("def parse(line):\n    parts = line.split(")
    want, lp_rows = reference(pair.target, prompt, processors)
    got, logprobs, steps = ours(pair, prompt, processors, tree_rows=rows, top_logprobs=2)
    assert got == want and sum(s.accepted for s in steps) > 0
    for token, row, lp in zip(want, lp_rows, logprobs):
        assert abs(lp.logprob - row[token]) < 1e-5


@pytest.mark.parametrize("rows", [8, 20])
def test_trees_with_a_previous_token_processor_equal_plain_decoding(builtin, rows):
    """Each tree node's row is processed after its own path, the node's token last."""
    pair, tokenizer = builtin
    prompt = tokenizer.encode("def parse(line):\n    parts = line.split(")
    plain, _ = reference(pair.target, prompt, [])
    processors = processors_for("previous", plain)
    want, _ = reference(pair.target, prompt, processors)
    assert want != plain
    got, _, steps = ours(pair, prompt, processors, tree_rows=rows)
    assert got == want and sum(s.accepted for s in steps) > 0
