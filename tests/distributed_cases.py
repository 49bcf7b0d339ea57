"""Decode cases run the same way in one process (the reference) and in every
rank of a sharded run (tests/distributed_driver.py), so the test can compare
token for token.

Each case decodes through the real decode loop with a scripted drafter built on
a real DFlash / DFlash 2 drafter (its forward and cache run as in production;
its proposals are the target's own greedy continuation with one token spoiled
per cycle at a rotating position), so every acceptance length and every
rollback depth occurs.
"""

import hashlib

import mlx.core as mx
import numpy as np

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams

from helpers import ScriptedDrafter, decode_steps

PROMPT = [5, 17, 42, 9, 101, 33, 7, 250]


def case_key(case: dict) -> str:
    return f"{case['kind']}-B{case['B']}-T{case['temp']:g}"


def run_cases(target, drafters: dict, cases: list[dict], max_tokens: int) -> dict:
    """Tokens per case, plus the first forward's logits and features (and their
    digests, for the bitwise comparison across ranks)."""
    out = {"tokens": {}}
    ar = [s.tokens[0] for s in decode_steps(PROMPT, Pair.make(target), DecodeRequest(max_tokens=max_tokens + 16))]
    out["tokens"]["ar"] = ar[:max_tokens]
    reference = PROMPT + ar
    for case in cases:
        base = drafters[case["kind"]]
        scripted = ScriptedDrafter(base, reference, len(PROMPT), lambda c, B=case["B"]: (c * 5 + 2) % B,
                                   target.vocab_size)
        pair = Pair.make(target, scripted)
        sampling = SamplingParams(temperature=case["temp"], seed=case.get("seed", 7))
        request = DecodeRequest(max_tokens=max_tokens, block_size=case["B"], sampling=sampling)
        steps = decode_steps(PROMPT, pair, request)
        out["tokens"][case_key(case)] = [t for s in steps for t in s.tokens]
    pair = Pair.make(target, drafters["dflash2"])
    logits, features = target(mx.array([PROMPT]), target.make_cache(), pair.layer_ids)
    # Compared as float32 (numpy has no bf16; a bf16 checkpoint keeps its dtype on the CPU).
    logits, features = logits.astype(mx.float32), features.astype(mx.float32)
    mx.eval(logits, features)
    out["logits"] = np.array(logits[0, -3:]).tolist()
    out["features"] = np.array(features[0, -3:]).tolist()
    out["digest"] = hashlib.sha256(np.array(logits).tobytes() + np.array(features).tobytes()).hexdigest()
    return out
