"""The cycle order is written once (engine/decode/sequence.py): the single-sequence
loop and the batch decoder, driven through the same scripted block schedule, must
ask the policy the same questions (tokens left, context) in the same order, tell
it the same outcomes, split the PRNG key chain the same way (seeded samples equal)
and commit the same tokens, pass for pass.
"""

from dataclasses import replace

import pytest

from dflash2_mlx.engine.batch.decoder import BatchDecoder
from dflash2_mlx.engine.decode.loop import generate_step
from dflash2_mlx.engine.decode.state import Choice
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.plan import plan
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams
from helpers import load_pair_for

# Plain steps (1) between drafted blocks of every kind: plain after plain launches the next
# step ahead, plain after a block, a block after plain, blocks back to back.
SCHEDULE = (1, 1, 4, 1, 3, 3, 1, 1, 2, 4, 1, 4, 4, 1, 1, 1, 3)


class ScriptedPolicy:
    """Chooses the scheduled blocks in turn and writes down every call it gets."""

    def __init__(self, schedule=SCHEDULE):
        self.schedule, self.calls = schedule, []

    def choose(self, tokens_left, context=None):
        B = self.schedule[len([c for c in self.calls if c[0] == "choose"]) % len(self.schedule)]
        self.calls.append(("choose", tokens_left, context))
        return Choice(1 if B == 1 else max(2, min(B, tokens_left + 1)))

    def record(self, choice):
        self.calls.append(("record", choice.block))

    def observe(self, drafted, accepted):
        self.calls.append(("observe", drafted, accepted))


def _plan(pair, request, prompt, batched):
    return replace(plan(pair, request, prompt_ids=prompt, batched=batched), policy=ScriptedPolicy())


def _alone(pair, request, prompt):
    decode = _plan(pair, request, prompt, batched=False)
    steps = [(s.tokens, s.drafted, s.accepted, s.verify_rows) for s in generate_step(prompt, pair, decode)]
    return steps, decode.policy.calls


def _batched(pair, request, prompt):
    decoder = BatchDecoder(pair, max_batch=1)
    decode = _plan(pair, request, prompt, batched=True)
    seq = decoder.add(prompt, decode)
    steps = []
    while not seq.finished:
        steps += [(s.tokens, s.drafted, s.accepted, s.verify_rows) for _, s in decoder.step()]
    decoder.remove(seq)
    return steps, decode.policy.calls


@pytest.mark.parametrize("sampling, top_logprobs", [
    (SamplingParams(), None),  # greedy: no keys, plain steps launched ahead
    (SamplingParams(temperature=1.0, seed=7), None),  # every key split shows in the samples
    (SamplingParams(temperature=1.0, seed=7), 3),  # a rows' rule: no launching ahead, decided at commit
])
def test_both_loops_run_one_cycle_order(sampling, top_logprobs):
    target, _, drafter = load_pair_for("qwen3")
    pair = Pair.make(target, drafter)
    prompt = [3, 17, 5, 9, 11, 2, 8]
    request = DecodeRequest(max_tokens=48, block_size=None, sampling=sampling, top_logprobs=top_logprobs)
    alone, alone_calls = _alone(pair, request, prompt)
    batched, batched_calls = _batched(pair, request, prompt)
    assert sum(len(t) for t, *_ in alone) == 48
    assert {d for _, d, *_ in alone} > {0}  # the schedule drafted, and decoded plainly
    assert batched_calls == alone_calls
    assert batched == alone
