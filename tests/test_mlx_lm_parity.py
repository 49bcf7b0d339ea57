"""The AR reference of the parity tests is mlx-lm's own greedy decoding.

test_parity.py, test_hybrid_targets.py and test_gemma_target.py assert that
greedy speculative decoding equals plain decoding (`generate_step` without a drafter), token for
token. That only proves losslessness if the AR loop itself decodes as mlx-lm
does, so here, once per supported target family (every model_type in
`families.FAMILIES`), a tiny random model is decoded both by
plain `generate_step` through `Target` and by
`mlx_lm.generate.generate_step` with mlx-lm's greedy sampler and its own
caches, and the two must agree token by token for N tokens. The models are
built as the other tests build them (`tools.synthetic.write_target`, loaded
by mlx-lm's own `load_model`), untied and tied; the sliding-window families
get a window of 8, so the N tokens run well past it. Untied, every case's
continuation is varied (checked), so the comparison is not vacuous; tied, some
random models repeat one token, and the tied head is compared all the same.
One greedy speculative run per family (random DFlash 2 drafter, untied) is
checked against the same mlx-lm tokens.

Equality is exact: on the CPU backend the forward of a block equals the same
tokens fed one at a time bitwise (platform.md), so mlx-lm's prefill split
(all but the last prompt token, then the last) gives the same logits as ours.
"""

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.target.adapter import Target
from dflash2_mlx.engine.target.families import FAMILIES
from dflash2_mlx.tools.synthetic import drafter_config_dict, random_drafter, write_target
from helpers import decode_steps

N = 40
WINDOW = 8
# Case -> (model_type, extra config), as test_hybrid_targets.py / test_gemma_target.py
# configure them: sliding windows of WINDOW, Gemma 3 with hidden 48 (sqrt(48)
# is not a bfloat16), llama also with sliding layers.
CASES = {
    "qwen3": ("qwen3", {}),
    "qwen2": ("qwen2", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "llama": ("llama", {}),
    "llama_sliding": ("llama", dict(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=WINDOW)),
    "mistral": ("mistral", {}),
    "phi3": ("phi3", {}),
    "qwen3_5": ("qwen3_5", {}),
    "qwen3_5_moe": ("qwen3_5_moe", {}),
    "qwen3_next": ("qwen3_next", {}),
    "muse_glimmer": ("muse_glimmer", dict(sliding_window=WINDOW)),
    "gemma3_text": ("gemma3_text", dict(hidden_size=48, sliding_window=WINDOW)),
}
# Short, and longer than the window (the prefill itself wraps it).
PROMPTS = {"short": [5], "medium": [17, 42, 99, 7, 250, 3, 61, 8, 9, 10, 11, 12]}


def test_every_supported_family_is_covered():
    assert set(FAMILIES) <= {model_type for model_type, _ in CASES.values()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from mlx_lm.utils import load_model

    root = tmp_path_factory.mktemp("mlx-lm-parity")
    made = {}

    def get(case, tie=False):
        if (case, tie) not in made:
            model_type, extra = CASES[case]
            folder = write_target(root / f"{case}-{tie}", model_type, tie_word_embeddings=tie, **extra)
            model, _ = load_model(folder)
            made[case, tie] = model, json.loads((folder / "config.json").read_text())
        return made[case, tie]

    return get


def mlx_lm_greedy(model, prompt, n=N):
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n, sampler=make_sampler(0.0))]


def _first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token {i}: {x} vs mlx-lm's {y}"
    return f"length {len(a)} vs mlx-lm's {len(b)}"


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("case", list(CASES))
def test_ar_reference_is_mlx_lm_greedy(models, case, tie):
    model, config = models(case, tie)
    target = Target(model)
    assert target.model_type == CASES[case][0]
    assert target.tied_embeddings is tie
    for name, prompt in PROMPTS.items():
        reference = mlx_lm_greedy(model, prompt)
        assert len(reference) == N
        if not tie:  # a model repeating one token would make the check vacuous
            assert len(set(reference)) >= 5, f"{case} {name}: mlx-lm's continuation is degenerate: {reference}"
        ours = [t for s in decode_steps(prompt, Pair.make(target), DecodeRequest(max_tokens=N)) for t in s.tokens]
        assert ours == reference, (f"{case} {'tied' if tie else 'untied'} {name}: AR loop diverged from "
                                   f"mlx-lm at {_first_diff(ours, reference)}")


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_speculative_is_mlx_lm_greedy(models, case):
    model, config = models(case)
    drafter = random_drafter(drafter_config_dict(config, "dflash2", block_size=16), seed=1)
    prompt = PROMPTS["medium"]
    reference = mlx_lm_greedy(model, prompt)
    steps = list(decode_steps(prompt, Pair.make(Target(model), drafter), DecodeRequest(max_tokens=N, block_size=5)))
    ours = [t for s in steps for t in s.tokens]
    assert ours == reference, f"{case}: speculative loop diverged from mlx-lm at {_first_diff(ours, reference)}"
