"""The real pair: SmolLM2-135M-Instruct (the `smollm2` named source) with the drafters trained
for it (recipes/smollm2_drafters). The drafters ship in the package, so their checks always run;
the model runs only where it is already cached (`slow`: a few of these run the real target)."""

import mlx.core as mx
import pytest

from dflash2_mlx.cli.model_source import ModelFolder
from dflash2_mlx.cli.inputs import drafter_for
from dflash2_mlx.engine.drafter.config import DrafterConfig
from dflash2_mlx.engine.grammar import Grammar
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.loading.builtin import resolve_builtin
from dflash2_mlx.loading.checkpoints import read_config
from helpers import decode_steps
from test_gguf import SMOLLM2, real


def given(name: str) -> ModelFolder:
    folder = ModelFolder("/somewhere/converted")
    folder.given = name
    return folder


@pytest.mark.parametrize("name,kind", [("smollm2", "dflash2"), ("smollm2-dflash", "dflash")])
def test_the_shipped_drafters_fit_smollm2_and_stay_small(name, kind):
    from pathlib import Path

    folder = Path(resolve_builtin(name, "drafter"))
    config = DrafterConfig.from_dict(read_config(folder, "drafter"))
    assert (config.hidden_size, config.vocab_size, config.num_target_layers) == (576, 49152, 30)
    assert ("DFlash2" in read_config(folder, "drafter")["architectures"][0]) == (kind == "dflash2")
    assert all(f.stat().st_size < 20 * 2**20 for f in folder.iterdir())
    assert (folder / "TRAINING.md").is_file()


def test_smollm2_gets_its_own_drafter_by_default():
    assert drafter_for(given("smollm2"), None) == "smollm2"
    assert drafter_for(given("smollm2"), None, ar=True) is None
    assert drafter_for(given("smollm2"), "smollm2-dflash") == "smollm2-dflash"


def ids_of(tokenizer, text: str) -> list[int]:
    # A short system message instead of the template's default one: each prefill of the
    # float32 target costs about 0.1 s a token here, and this test runs twelve.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(prompt, add_special_tokens=False)


@pytest.fixture(scope="module")
def pair():
    from dflash2_mlx.loading.gguf.convert import converted_folder
    from dflash2_mlx.loading.load_pair import load_pair

    if not SMOLLM2.is_file():
        pytest.skip(f"SmolLM2 not cached ({SMOLLM2})")
    import tempfile

    folder = converted_folder(SMOLLM2, tempfile.mkdtemp())
    return load_pair(str(folder), "smollm2", activation_dtype=mx.float32)


@pytest.mark.slow
@real
def test_greedy_speculation_batches_and_schemas_on_the_real_pair_are_plain_greedy_decoding(pair):
    # (Every block size 2-16 and trees of 8 and 16, on 21 held-out prompts and the float target:
    # benchmarks/acceptance/real_pair_tau.py, benchmarks/results/smollm2-tau-cpu.json. Here the shipped Q4_1 target,
    # on few tokens: a real-model pass on this CPU costs seconds.)
    from dflash2_mlx.engine.batch.decoder import BatchDecoder
    from dflash2_mlx.engine.plan import plan

    pair, tokenizer = pair
    prompts = [ids_of(tokenizer, q) for q in ("Write a Python function that reverses a string.",
                                              "What is the capital of France?", "What is 12 + 30?",
                                              "Name a large animal.")]
    want = [[s.tokens[0] for s in decode_steps(p, pair.without_drafter(), DecodeRequest(max_tokens=6))]
            for p in prompts]
    for kw in (dict(block_size=16), dict(block_size=None, tree_rows=8)):
        steps = list(decode_steps(prompts[0], pair, DecodeRequest(max_tokens=6, **kw)))
        assert [t for s in steps for t in s.tokens][:6] == want[0], kw
        # The drafter is real: some cycle commits drafted tokens (else this checks plain decoding).
        assert max(len(s.tokens) for s in steps[1:]) > 1, kw
    decoder = BatchDecoder(pair, max_batch=4)
    seqs = [decoder.add(p, plan(pair, DecodeRequest(max_tokens=6, block_size=6), prompt_ids=p, batched=True))
            for p in prompts]
    got, widest = {id(s): [] for s in seqs}, 0
    while any(not s.finished for s in seqs):
        for seq, step in decoder.step():
            got[id(seq)].extend(step.tokens)
        widest = max(widest, decoder.last_pass[0])
    assert widest >= 2  # sequences shared passes
    assert [got[id(s)][:6] for s in seqs] == want
    # Under a JSON schema: the same tokens as plain decoding under it.
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ids = ids_of(tokenizer, "Answer in JSON: which city is the capital of France?")

    def constrained(p, block_size=None):
        request = DecodeRequest(max_tokens=8, grammar=Grammar.json_schema(schema), block_size=block_size)
        return [t for s in decode_steps(mx.array(ids), p, request, tokenizer=tokenizer) for t in s.tokens]

    plain = constrained(pair.without_drafter())
    assert tokenizer.decode(plain).lstrip().startswith("{")
    assert constrained(pair, block_size=8) == plain
