"""Structured output inside speculation (docs/structured.md).

The reference is mlx-lm's own plain decoding (`mlx_lm.generate.generate_step`)
with a logits processor that masks every row by an llguidance matcher, written
here from llguidance's numpy helpers alone: greedy DFlash / DFlash 2 under a
grammar must give its tokens exactly. Sampled, the first constrained token of a
cycle must follow the masked target distribution (chi-square), and a wrong
rule (the residual taken from the unmasked target) must fail the same test;
and through `generate_step` and the batch decoder, each cycle's first sampled
token must follow its own masked row.
Outputs are validated by the `jsonschema` library.
"""

import json
from dataclasses import replace

import jsonschema
import llguidance
import llguidance.hf
import llguidance.numpy as llg_np
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step as mlx_lm_generate_step
from scipy.stats import chisquare

from dflash2_mlx import load_pair
from dflash2_mlx.engine.decode.constrained import grammar_propose
from dflash2_mlx.engine.decode.verify import _leading_run, accept_sampled
from dflash2_mlx.engine.grammar import JSON_LAYOUT, Grammar, GrammarState, masked
from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.plan import plan
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.engine.sampling import SamplingParams, make_logprobs_transform
from dflash2_mlx.errors import DFlashError

from helpers import decode_steps, load_pair_for, pick_pvalues

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "cc"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
CALL = {"type": "object", "properties": {"path": {"type": "string", "pattern": "^[a-z/]{1,16}$"},
                                         "recursive": {"type": "boolean"}},
        "required": ["path", "recursive"], "additionalProperties": False}
PROMPTS = ["config = ", "def load(path):\n    return ", "# the answer as JSON\n"]


@pytest.fixture(scope="module")
def builtin():
    return load_pair("builtin", "builtin")


def reference_tokens(target, tokenizer, prompt_ids, grammar_text, n, vocab):
    """Constrained plain decoding by mlx-lm: greedy, every row masked by a fresh matcher."""
    lltok = llguidance.hf.from_tokenizer(tokenizer._tokenizer, n_vocab=vocab,
                                         eos_token=sorted(tokenizer.eos_token_ids))
    matcher = llguidance.LLMatcher(lltok, grammar_text, log_level=0)
    bitmask = llg_np.allocate_token_bitmask(1, vocab)
    seen = [len(prompt_ids)]

    def constrain(tokens, logits):
        for t in np.array(tokens)[seen[0]:].tolist():
            if not matcher.is_stopped():
                assert matcher.consume_token(t)
        seen[0] = len(tokens)
        llg_np.fill_next_token_bitmask(matcher, bitmask)
        row = np.array(logits.astype(mx.float32))
        llg_np.apply_token_bitmask_inplace(row, bitmask)
        return mx.array(row)

    out = []
    for token, _ in mlx_lm_generate_step(mx.array(prompt_ids), target.model, max_tokens=n,
                                         sampler=lambda x: mx.argmax(x, axis=-1), logits_processors=[constrain]):
        out.append(int(token))
        if int(token) in tokenizer.eos_token_ids:
            break
    return out


def ours(pair, tokenizer, prompt_ids, grammar, n, **kw):
    request = DecodeRequest(**{"max_tokens": n, "grammar": grammar, "block_size": None, **kw})
    return [t for s in decode_steps(mx.array(prompt_ids), pair, request, tokenizer=tokenizer) for t in s.tokens]


@pytest.mark.parametrize("schema", [PERSON, CALL], ids=["person", "call"])
def test_greedy_speculation_equals_constrained_plain_decoding_builtin(builtin, schema):
    pair, tokenizer = builtin
    grammar = Grammar.json_schema(schema)
    text = grammar.compiled()
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        want = reference_tokens(pair.target, tokenizer, ids, text, 80, pair.target.vocab_size)
        assert want[-1] in tokenizer.eos_token_ids, "the reference must finish its JSON within the budget"
        jsonschema.validate(json.loads(tokenizer.decode(want[:-1])), schema)
        assert ours(pair.without_drafter(), tokenizer, ids, grammar, 80) == want
        for block in (16, 4):
            assert ours(pair, tokenizer, ids, grammar, 80, block_size=block) == want, (prompt, block)


@pytest.mark.parametrize("family,kind", [("qwen3", "dflash2"), ("llama", "dflash2"), ("qwen3", "dflash"),
                                         ("qwen3_5", "dflash2")])
def test_greedy_speculation_equals_constrained_plain_decoding_families(family, kind):
    target, tokenizer, drafter = load_pair_for(family, kind)
    pair = Pair.make(target, drafter)
    grammar = Grammar.regex(r"(ab|cd|[0-9]{2,4}|x+y)+;")
    ids = tokenizer.encode("hello world")
    want = reference_tokens(target, tokenizer, ids, grammar.compiled(), 40, target.vocab_size)
    assert len(set(want)) > 3  # the grammar leaves the model choices: not a forced string
    for block in (8, 3):
        assert ours(pair, tokenizer, ids, grammar, 40, block_size=block) == want, block


def test_drafts_only_allowed_tokens_and_forced_ones_cost_no_acceptance(builtin):
    pair, tokenizer = builtin
    # A literal prefix: every token of it is forced, so the drafter's guess does not matter.
    grammar = Grammar.regex(r"result_value_is_[0-9]{3}")
    request = DecodeRequest(max_tokens=40, block_size=16, grammar=grammar)
    steps = list(decode_steps(mx.array(tokenizer.encode("x = ")), pair, request, tokenizer=tokenizer))
    text = tokenizer.decode([t for s in steps for t in s.tokens][:-1])
    assert text.startswith("result_value_is_") and len(text) == len("result_value_is_") + 3
    # The prefill wrote "result"; the first cycle drafts the forced "_value_is_" (canonical
    # tokens, one per "_", "value", "_", "is", "_") and the target accepts all of them.
    first = next(s for s in steps[1:] if s.drafted)
    assert first.accepted >= 5 and tokenizer.decode(list(first.tokens[:5])) == "_value_is_"



def first_token_counts(builtin, rule, n):
    """The first token each of `n` sampled cycles commits after a fixed context, under `rule`."""
    pair, tokenizer = builtin
    sampling = SamplingParams(temperature=1.0)
    transform = make_logprobs_transform(sampling)
    grammar = Grammar.regex(r"(def|class|import|return|if|for|while) [a-z_]{1,8}")
    ids = tokenizer.encode("\n")
    cache = [pair.target.make_cache(), pair.drafter.make_cache()]
    target_logits, features = pair.target(mx.array([ids]), cache[0], pair.layer_ids)
    hidden, draft_logits = pair.drafter.draft(
        mx.array([[ids[-1]] + [pair.mask_token_id] * 3], dtype=mx.int32), features, cache[1], pair.target)
    state = GrammarState(grammar, tokenizer, pair.target.vocab_size)
    row0 = target_logits[0, -1:]
    exact = np.array(mx.softmax(transform(masked(row0, state.allowed()[None])), axis=-1, precise=True))[0]
    counts = {}
    for i in range(n):
        k_draft, k_accept = mx.random.split(mx.random.key(i))
        prop, masks = grammar_propose(pair.drafter, draft_logits[:1], hidden[:1], ids[-1], sampling, transform,
                                      k_draft, pair.selector_transform, state)
        # The verify rows: the target's row 0, then (one draft) the row after it, here row 0 again
        # (only the first committed token is counted, and it never depends on row 1).
        rows = mx.concatenate([row0, row0], axis=0)[: prop.draft.size + 1]
        token = rule(prop, rows, masks, transform, k_accept)
        counts[token] = counts.get(token, 0) + 1
    return counts, exact


def exact_rule(prop, rows, masks, transform, key):
    a, bonus = accept_sampled(prop.draft, prop.q_full, masked(rows, masks), transform, key)
    return int(prop.draft[0].item()) if a.item() > 0 else int(bonus.item())


def unmasked_residual_rule(prop, rows, masks, transform, key):
    """Acceptance against the masked target, but the residual from the unmasked one (wrong)."""
    k_accept, k_bonus = mx.random.split(key, 2)
    p_masked = mx.softmax(transform(masked(rows, masks)), axis=-1, precise=True)
    p_raw = mx.softmax(transform(rows), axis=-1, precise=True)
    d = prop.draft
    u = mx.random.uniform(shape=d.shape, key=k_accept)
    ok = u * mx.take_along_axis(prop.q_full, d[:, None], -1)[:, 0] < mx.take_along_axis(p_masked[:-1], d[:, None], -1)[:, 0]
    if _leading_run(ok).item() > 0:
        return int(d[0].item())
    r = mx.maximum(p_raw[0] - prop.q_full[0], 0.0)
    return int(mx.random.categorical(mx.log(r / mx.sum(r)), key=k_bonus).item())


def gof(counts, exact, n):
    """Chi-square p-value of `counts` against `exact` (cells under 5 expected merged); 0 when
    any token lies outside its support."""
    if any(exact[t] == 0 for t in counts):
        return 0.0
    exact = exact.astype(np.float64) / exact.sum()
    big = np.flatnonzero(exact * n >= 5)
    obs = np.array([counts.get(int(t), 0) for t in big], float)
    exp = exact[big] * n
    rest_obs, rest_exp = n - obs.sum(), n - exp.sum()
    if rest_exp >= 1:
        obs, exp = np.append(obs, rest_obs), np.append(exp, rest_exp)
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.slow
def test_sampled_constrained_tokens_follow_the_masked_target_distribution(builtin):
    n = 1500
    counts, exact = first_token_counts(builtin, exact_rule, n)
    assert (exact > 0).sum() >= 3  # several allowed tokens carry the mass: a real test
    assert gof(counts, exact, n) > 1e-3
    wrong, _ = first_token_counts(builtin, unmasked_residual_rule, n)
    assert gof(wrong, exact, n) < 1e-6


def test_seeded_sampling_under_a_grammar_validates_and_repeats(builtin):
    pair, tokenizer = builtin
    grammar = Grammar.json_schema(CALL)
    ids = tokenizer.encode(PROMPTS[0])
    runs = [ours(pair, tokenizer, ids, grammar, 80, block_size=8,
                 sampling=SamplingParams(temperature=1.0, seed=s)) for s in (1, 2, 3, 1)]
    assert runs[0] == runs[3]
    for tokens in runs:
        assert tokens[-1] in tokenizer.eos_token_ids  # the schema bounds the answer inside 80 tokens
        jsonschema.validate(json.loads(tokenizer.decode(tokens[:-1])), CALL)


def test_bad_grammars_are_one_line_errors():
    for grammar in (Grammar.regex("([a-"), Grammar.json_schema("{nope"), Grammar.json_schema("[1, 2]"),
                    Grammar("yaml", "x")):
        with pytest.raises(DFlashError) as e:
            grammar.compiled()
        assert "\n" not in str(e.value) and "grammar" in str(e.value)


@pytest.mark.parametrize("rows", [8, 24])
def test_greedy_trees_under_a_grammar_equal_constrained_plain_decoding(builtin, rows):
    pair, tokenizer = builtin
    grammar = Grammar.json_schema(PERSON)
    for prompt in PROMPTS[:2]:
        ids = tokenizer.encode(prompt)
        want = reference_tokens(pair.target, tokenizer, ids, grammar.compiled(), 80, pair.target.vocab_size)
        assert ours(pair, tokenizer, ids, grammar, 80, tree_rows=rows) == want, (prompt, rows)


def test_sampled_trees_under_a_grammar_validate(builtin):
    pair, tokenizer = builtin
    for seed in range(3):
        tokens = ours(pair, tokenizer, tokenizer.encode(PROMPTS[0]), Grammar.json_schema(CALL), 80, tree_rows=12,
                      sampling=SamplingParams(temperature=1.0, seed=seed))
        assert tokens[-1] in tokenizer.eos_token_ids
        jsonschema.validate(json.loads(tokenizer.decode(tokens[:-1])), CALL)


def test_json_layout_is_compact(builtin):
    pair, tokenizer = builtin
    tokens = ours(pair, tokenizer, tokenizer.encode(PROMPTS[1]), Grammar.json_schema(PERSON), 80, block_size=16)
    text = tokenizer.decode(tokens[:-1])
    assert JSON_LAYOUT == {"whitespace_flexible": False}
    assert text == json.dumps(json.loads(text), separators=(",", ":"))


def test_cli_json_schema_and_regex(tmp_path):
    from cli_process import Sandbox

    box = Sandbox(tmp_path)
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    ok = box.run(["generate", "-p", "config = ", "--json-schema", str(schema), "--json", "-m", "80",
                  "--block-size", "8", "--ignore-chat-template"])
    assert ok.code == 0, ok.err
    jsonschema.validate(json.loads(json.loads(ok.out)["text"]), PERSON)
    date = box.run(["generate", "-p", "when = ", "--regex", r"20[0-9]{2}-[01][0-9]", "--json", "--ar"])
    assert date.code == 0, date.err
    assert __import__("re").fullmatch(r"20[0-9]{2}-[01][0-9]", json.loads(date.out)["text"])
    (tmp_path / "broken.json").write_text("{nope")
    for args, words in ((["--json-schema", str(tmp_path / "broken.json")], "json schema"),
                        (["--json-schema", str(tmp_path / "missing.json")], "cannot read"),
                        (["--regex", "([a-"], "unclosed"),
                        (["--regex", "a", "--json-schema", str(schema)], "one of them")):
        assert words in box.run(["generate", "-p", "x", *args]).one_error_line()


# Under a grammar at T > 0, through the real wiring (generate_step's chain cycle, and the
# batch decoder) rather than `accept_sampled`, on the synthetic qwen3 pair: the first token
# comes from the prefill, the second is the first one the first cycle commits (its draft
# accepted, or the residual's draw). Each second token is checked against its own exact
# row, the masked distribution after the prompt and the first token, built from mlx-lm's
# model call, an llguidance matcher and `helpers.mlx_lm_distribution`, by
# `helpers.pick_pvalues` (PIT and token counts, chi-square at ALPHA_GRAMMAR).
ALPHA_GRAMMAR, N_GRAMMAR = 1e-3, 200
GRAMMAR_SAMPLING = SamplingParams(temperature=1.0)
GRAMMAR_REGEX = r"(ab|cd|[0-9]{2,4}|x+y)+;"


@pytest.fixture(scope="module")
def synthetic():
    target, tokenizer, drafter = load_pair_for("qwen3", "dflash2")
    return Pair.make(target, drafter), tokenizer


class MaskedRows:
    """The masked target distribution mlx-lm samples from after `ids` and a prefix."""

    def __init__(self, target, tokenizer, ids, grammar_text, sampling):
        vocab = target.vocab_size
        self.lltok = llguidance.hf.from_tokenizer(tokenizer._tokenizer, n_vocab=vocab,
                                                  eos_token=sorted(tokenizer.eos_token_ids))
        self.bitmask = llg_np.allocate_token_bitmask(1, vocab)
        self.target, self.ids, self.text, self.sampling, self.rows = target, ids, grammar_text, sampling, {}

    def __call__(self, prefix: tuple) -> np.ndarray:
        from helpers import mlx_lm_distribution

        if prefix not in self.rows:
            matcher = llguidance.LLMatcher(self.lltok, self.text, log_level=0)
            for t in prefix:
                assert matcher.consume_token(t)
            llg_np.fill_next_token_bitmask(matcher, self.bitmask)
            row = np.array(self.target.model(mx.array([self.ids + list(prefix)]))[0, -1].astype(mx.float32))
            llg_np.apply_token_bitmask_inplace(row, self.bitmask)
            self.rows[prefix] = mlx_lm_distribution(mx.array(row), self.sampling)
        return self.rows[prefix]


def _check_second_tokens(runs, exact: MaskedRows):
    """`runs`: (tokens, steps) of each sampled sequence."""
    picks, accepted, drafted = [], 0, 0
    for tokens, steps in runs:
        assert exact(())[tokens[0]] > 0, "a first token outside the masked distribution's support"
        picks.append((tokens[1], exact((tokens[0],))))
        accepted, drafted = accepted + sum(s.accepted for s in steps), drafted + sum(s.drafted for s in steps)
    pit, counts = pick_pvalues(picks)
    print(f"grammar: {accepted}/{drafted} drafts accepted, PIT p = {pit:.3g}, token counts p = {counts:.3g}")
    assert min(pit, counts) > ALPHA_GRAMMAR, f"chi-square p = {pit:.2e} (PIT), {counts:.2e} (token counts)"
    assert 0.05 < accepted / drafted < 0.95, (accepted, drafted)  # both branches of the rule ran


def test_sampled_generate_step_under_a_grammar_follows_the_masked_target(synthetic):
    """Fails when the acceptance ratio reads the unmasked target and the residual the
    masked one (decode/chain.py; measured: 5 of 200 drafts accepted, not 132, PIT p = 6e-4,
    token counts p = 7e-8)."""
    pair, tokenizer = synthetic
    grammar, ids = Grammar.regex(GRAMMAR_REGEX), tokenizer.encode("hello world")
    runs = []
    for seed in range(N_GRAMMAR):
        request = DecodeRequest(max_tokens=2, block_size=4, sampling=replace(GRAMMAR_SAMPLING, seed=seed),
                                grammar=grammar)
        steps = list(decode_steps(mx.array(ids), pair, request, tokenizer=tokenizer))
        runs.append(([t for s in steps for t in s.tokens], steps))
    _check_second_tokens(runs, MaskedRows(pair.target, tokenizer, ids, grammar.compiled(), GRAMMAR_SAMPLING))


def test_sampled_batches_under_a_grammar_follow_the_masked_target(synthetic):
    """As above through `BatchDecoder` (the wiring in engine/batch/decoder.py `_pick`),
    eight grammar sequences at a time beside two greedy companions already decoding. The
    same wrong rule in `_pick` fails it with the same numbers (seeded: alone = batched)."""
    from helpers import run_beside_companions

    pair, tokenizer = synthetic
    grammar, ids = Grammar.regex(GRAMMAR_REGEX), tokenizer.encode("hello world")
    runs = []
    for first in range(0, N_GRAMMAR, 8):
        plans = [plan(pair, DecodeRequest(max_tokens=2, block_size=4, sampling=replace(GRAMMAR_SAMPLING, seed=seed),
                                          grammar=grammar), prompt_ids=ids, tokenizer=tokenizer, batched=True)
                 for seed in range(first, first + 8)]
        tokens, steps, fewest = run_beside_companions(pair, ids, plans)
        assert fewest >= 3  # every sampled cycle ran beside both companions
        runs.extend(zip(tokens, steps))
    _check_second_tokens(runs, MaskedRows(pair.target, tokenizer, ids, grammar.compiled(), GRAMMAR_SAMPLING))
