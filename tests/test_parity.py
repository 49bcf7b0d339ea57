"""Greedy speculative decoding must be token-identical to plain greedy decoding.

On MLX's CPU backend a block forward gives bitwise the same logits as the same
tokens fed one by one (docs/algorithm.md §8), so equality is asserted exactly.
"""

from functools import lru_cache

import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.loading.checkpoints import load_target
from dflash2_mlx.engine.request import DecodeRequest, RequestError
from helpers import FAMILIES, ScriptedDrafter, ar_tokens, decode_steps, load_pair_for, target_folder

PROMPTS = {"short": [5], "medium": [17, 42, 99, 7, 250, 3, 61], "long": list(range(20, 120, 3))}
N = 40
LONGEST = 16 * 17 // 2 + 2 * 16 + 16  # the scripted test's B = 16: its tokens and one block more


@lru_cache(maxsize=None)
def greedy(family: str, name: str) -> list[int]:
    """Plain greedy decoding of PROMPTS[name] by the family's target, as long as any
    test here reads. Greedy m tokens are the first m of a longer run, so one decode
    serves every B and both drafter kinds."""
    return ar_tokens(load_target(str(target_folder(family)))[0], PROMPTS[name], LONGEST)


def spec(target, drafter, prompt, B, n=N, **kw):
    steps = list(decode_steps(prompt, Pair.make(target, drafter), DecodeRequest(max_tokens=n, block_size=B, **kw)))
    return [t for s in steps for t in s.tokens], steps


@pytest.mark.parametrize("family", FAMILIES)
def test_scripted_drafter_hits_every_acceptance_length(family):
    """Every family: acceptance lengths 0..B-1 for every B = 2..16 after the
    medium prompt, and for a spread of B after the short and the long one (the
    rollback does not depend on the prompt's length beyond where the cache
    starts, so every B at every length repeated the same rollbacks)."""
    target, _, base = load_pair_for(family, "dflash")
    V = target.vocab_size
    lengths = lambda B: B * (B + 1) // 2 + 2 * B  # B full cycles: every length once
    for name, prompt in PROMPTS.items():
        reference = greedy(family, name)
        for B in range(2, 17) if name == "medium" else (2, 3, 5, 9, 16):
            n = lengths(B)
            drafter = ScriptedDrafter(base, reference, len(prompt), lambda c, B=B: c % B, V)
            out, steps = spec(target, drafter, prompt, B, n=n)
            assert out == reference[:n], f"{family} {name} B={B}: diverged at {_first_diff(out, reference)}"
            full = [s.accepted for s in steps[1:] if s.drafted == B - 1]
            assert set(full) == set(range(B)), f"{family} {name} B={B}: lengths seen {sorted(set(full))}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_random_drafter_parity(family, kind):
    target, _, drafter = load_pair_for(family, kind)
    for name, prompt in PROMPTS.items():
        reference = greedy(family, name)[:N]
        for B in (2, 5, 16):
            out, _ = spec(target, drafter, prompt, B)
            assert out == reference, f"diverged at {_first_diff(out, reference)}"


def test_quantized_target_parity():
    """A 4-bit target quantized as mlx-lm's convert does, with a DFlash 2 drafter."""
    target, _, base = load_pair_for("qwen3", "dflash2", quantize_bits=4)
    assert type(target.model.model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    prompt = PROMPTS["medium"]
    reference = ar_tokens(target, prompt, N + 16)
    for B in (3, 8, 16):
        drafter = ScriptedDrafter(base, reference, len(prompt), lambda c, B=B: c % B, target.vocab_size)
        out, _ = spec(target, drafter, prompt, B)
        assert out == reference[:N]
        out, _ = spec(target, base, prompt, B)
        assert out == reference[:N]


def test_quantized_drafter_parity():
    from dflash2_mlx.loading.quantize import DraftQuant, quantize_drafter

    target, _, drafter = load_pair_for("qwen3", "dflash2")
    quantize_drafter(drafter, DraftQuant.parse("w4a32:gs32"))
    assert type(drafter.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    for prompt in PROMPTS.values():
        out, _ = spec(target, drafter, prompt, 6)
        assert out == ar_tokens(target, prompt, N)


def test_max_tokens_is_exact_and_eos_free():
    target, _, drafter = load_pair_for("qwen3", "dflash2")
    for n in (1, 2, 3, 17):
        out, _ = spec(target, drafter, PROMPTS["short"], 16, n=n)
        assert len(out) == n


def test_runtime_block_size_is_bounded():
    target, _, drafter = load_pair_for("qwen3", "dflash2")
    for B in (1, 17):
        with pytest.raises(RequestError, match=f"block_size {B} is outside") as e:
            spec(target, drafter, [1, 2], B)
        assert e.value.field == "block_size"


def _first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token {i}: {x} vs {y}"
    return f"length {len(a)} vs {len(b)}"
