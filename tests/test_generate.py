"""The tokenizer-aware generator (`stream_generate`): text, flags, finish reasons, stats.

Two controllable pieces keep these tests exact without mocking the generator:
`ScriptedDrafter` (helpers) proposes the target's own continuation with one
scheduled wrong token per cycle, and `ScriptedTarget` (below) runs the real
tiny target (real caches, real features) but replaces its logits so that the
greedy continuation is a chosen token sequence (code, UTF-8, EOS, stop strings).
"""

import shutil

import mlx.core as mx
import pytest

from dflash2_mlx.engine.pair import Pair
from dflash2_mlx.engine.request import DecodeRequest
from dflash2_mlx.errors import DFlashError
from dflash2_mlx.text.generate import stream_generate
from dflash2_mlx.loading.checkpoints import load_target
from dflash2_mlx.engine.sampling import SamplingParams
from dflash2_mlx.tools.synthetic import EOS, write_tokenizer
from dflash2_mlx.engine.target.adapter import Target
from helpers import ScriptedDrafter, ar_tokens, decode_steps, load_pair_for, target_folder

EOS_ID = 0
PROMPT_TEXT = "def f(x):\n"
# Code with leading indentation, a tab, and multi-byte UTF-8 (2-, 3- and 4-byte characters).
CODE = (
    "    café = '日本語' 🙂\n"
    "\tdef grüße(x , y):\n"
    "        return \"Привет\" + x  # ✨ naïve\n"
)
NON_ASCII_CORPUS = (
    "Grüße aus Köln, café crème, naïve résumé. 日本語のテキストです。東京は大きい。 "
    "Ελληνικά γράμματα. Привет, мир! emoji 🙂🚀✨ "
) * 40


# -- controllable pieces -------------------------------------------------------------


class ScriptedTarget(Target):
    """The real target forward (caches and features unchanged) with logits that
    make `script` the greedy continuation of any prompt of `prompt_len` tokens."""

    def __init__(self, base: Target, prompt_len: int, script):
        super().__init__(base.model)
        self.prompt_len, self.script = prompt_len, list(script)

    def _forward(self, tokens, cache, layer_ids, last_logits_only, record):
        start = cache[0].offset
        _, features = super()._forward(tokens, cache, layer_ids, last_logits_only, record)
        L = tokens.shape[1]
        rows = [start + L - 1] if last_logits_only else list(range(start, start + L))
        # The row at absolute position p predicts the token at p + 1.
        last = len(self.script) - 1
        wanted = [self.script[min(max(p + 1 - self.prompt_len, 0), last)] for p in rows]
        V = self.vocab_size
        logits = 30.0 * (mx.arange(V)[None, :] == mx.array(wanted)[:, None]).astype(mx.float32)
        return logits[None], features


def never(cycle):  # a ScriptedDrafter schedule that corrupts nothing
    return 1 << 30


def run(target, tokenizer, prompt, drafter=None, block_size=None, **kw):
    """stream_generate of a DecodeRequest of `kw` (block_size None: the drafter's fixed block)."""
    request = DecodeRequest(block_size=block_size, **kw)
    return list(stream_generate(Pair.make(target, drafter), tokenizer, prompt, request))


def joined(responses):
    return "".join(r.text for r in responses)


def token_ids(responses):
    return [r.token for r in responses]


def scripted(base_target, base_drafter, tokenizer, script, mode, B=4, schedule=lambda c: c % 4):
    """(target, drafter-or-None, prompt ids) producing `script` greedily."""
    prompt = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    target = ScriptedTarget(base_target, len(prompt), script)
    drafter = None
    if mode != "ar":
        drafter = ScriptedDrafter(base_drafter, script, len(prompt), schedule, target.vocab_size)
    return target, drafter, prompt


def expected_from_steps(steps):
    """Stats recomputed independently from DecodeSteps (docs/algorithm.md §5)."""
    cycles = steps[1:]  # steps[0] is the prefill token
    B = max(s.drafted for s in cycles) + 1
    hist = [0] * B
    reached, hit = [0] * (B - 1), [0] * (B - 1)
    for s in cycles:
        hist[len(s.tokens) - 1] += 1
        for t in range(s.drafted):
            if t > s.accepted:  # an earlier position was rejected: t is never reached
                break
            reached[t] += 1
            hit[t] += t < s.accepted
    committed = sum(len(s.tokens) for s in cycles)
    return dict(
        target_passes=len(cycles), mean_acceptance_length=committed / len(cycles),
        acceptance_histogram=hist, acceptance_by_position=[h / r if r else 0.0 for h, r in zip(hit, reached)],
        drafted=sum(s.drafted for s in cycles), accepted=sum(s.accepted for s in cycles),
    )


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    """Real tiny qwen3 target + byte-level tokenizer + DFlash 2 drafter."""
    return load_pair_for("qwen3", "dflash2")


@pytest.fixture(scope="module")
def dflash_pair():
    return load_pair_for("qwen3", "dflash")


def _spm_tokenizer(folder):
    """A SentencePiece-style tokenizer (Metaspace, byte fallback, first-space strip),
    the kind whose decode drops a leading space (Llama, Mistral)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    special = [EOS, "<|im_start|>", "<|im_end|>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=382, special_tokens=special, show_progress=False)
    tok.train_from_iterator([(target_folder("qwen3") / "config.json").read_text() * 3 + CODE * 3], trainer)
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def tokenizers(pair, tmp_path_factory):
    """name -> tokenizer over the same target weights: byte-level BPE trained on ASCII
    (non-ASCII split into single bytes), byte-level BPE trained on non-ASCII text
    (tokens that end or start mid-character), and SentencePiece-style."""
    target, tok, drafter = pair
    out = {"bytelevel": tok}
    root = tmp_path_factory.mktemp("tokenizers")
    for name in ("utf8", "spm"):
        folder = root / name
        shutil.copytree(target_folder("qwen3"), folder)
        if name == "utf8":
            write_tokenizer(folder, 382, NON_ASCII_CORPUS + CODE)
        else:
            _spm_tokenizer(folder)
        out[name] = load_target(str(folder))[1]
    return out


# -- streamed text --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ar", "dflash2"])
@pytest.mark.parametrize("tok_name", ["bytelevel", "utf8", "spm"])
def test_streamed_text_is_exact_for_code_and_utf8(pair, tokenizers, mode, tok_name):
    base_target, _, base_drafter = pair
    tok = tokenizers[tok_name]
    script = tok.encode(CODE, add_special_tokens=False)
    if tok_name != "spm":
        assert tok.decode(script) == CODE
    pieces = [tok.decode([i]) for i in script]
    if tok_name in ("bytelevel", "utf8"):  # the script really splits characters across tokens
        assert any(p.endswith("\ufffd") or p.startswith("\ufffd") for p in pieces)
    target, drafter, prompt = scripted(base_target, base_drafter, tok, script, mode)
    rs = run(target, tok, prompt, drafter=drafter, max_tokens=len(script), block_size=4)
    assert token_ids(rs) == script
    text = joined(rs)
    # In context, the continuation is exactly the code (leading spaces kept).
    full = tok.decode(prompt + script)
    assert text == full[len(tok.decode(prompt)):] == CODE
    if tok_name != "spm":  # byte-level: also a plain decode of the generated ids
        assert text == tok.decode(token_ids(rs))
    # Never emits a replacement character for a character that is still incomplete.
    so_far = ""
    for r in rs:
        so_far += r.text
        assert CODE.startswith(so_far), repr(so_far)
    assert rs[-1].finish_reason == "length"
    if mode == "dflash2":
        assert any(r.from_draft for r in rs)


@pytest.mark.parametrize("mode", ["ar", "dflash", "dflash2"])
def test_random_target_stream_equals_decode(pair, dflash_pair, mode):
    """The untouched random target emits arbitrary bytes (invalid UTF-8 included)."""
    target, tok, drafter = dflash_pair if mode == "dflash" else pair
    prompt = tok.encode("    for i in range(10):\n", add_special_tokens=False)
    n = 48
    rs = run(target, tok, prompt, drafter=None if mode == "ar" else drafter, max_tokens=n)
    ids = token_ids(rs)
    assert EOS_ID not in ids  # otherwise this prompt would not test max_tokens
    assert len(rs) == n and rs[-1].finish_reason == "length"
    assert joined(rs) == tok.decode(ids)
    assert ids == ar_tokens(target, prompt, n)  # greedy speculative output is the AR output
    assert rs[-1].stats.mode == mode


def test_string_prompt_is_encoded(pair):
    target, tok, drafter = pair
    rs = run(target, tok, PROMPT_TEXT, drafter=drafter, max_tokens=3)
    assert rs[-1].stats.prompt_tokens == len(tok.encode(PROMPT_TEXT)) == rs[0].prompt_tokens
    assert token_ids(rs) == ar_tokens(target, tok.encode(PROMPT_TEXT), 3)


# -- from_draft, finish reasons ------------------------------------------------------------------


def test_from_draft_marks_exactly_the_accepted_drafts(pair):
    target, tok, base = pair
    prompt = [17, 42, 99, 7, 250, 3, 61]
    reference = ar_tokens(target, prompt, 24)
    drafter = ScriptedDrafter(base, reference, len(prompt), lambda c: c % 4, target.vocab_size)
    rs = run(target, tok, prompt, drafter=drafter, max_tokens=11, block_size=4)
    # prefill token; then cycles corrupting draft 0, 1, 2, none (accept 0, 1, 2, 3).
    expected = [False] + [False] + [True, False] + [True, True, False] + [True, True, True, False]
    assert [r.from_draft for r in rs] == expected
    assert token_ids(rs) == reference[:11]
    assert [r.generation_tokens for r in rs] == list(range(1, 12))
    assert all(r.prompt_tokens == len(prompt) for r in rs)
    assert all(r.finish_reason is None and r.stats is None for r in rs[:-1])
    s = rs[-1].stats
    assert rs[-1].finish_reason == "length"
    assert (s.target_passes, s.generation_tokens, s.prompt_tokens) == (4, 11, len(prompt))
    assert s.acceptance_histogram == [1, 1, 1, 1]
    assert s.mean_acceptance_length == pytest.approx(10 / 4)
    assert s.acceptance_by_position == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    assert (s.drafted, s.accepted) == (12, 6) and s.acceptance_rate == pytest.approx(0.5)
    assert (s.mode, s.block_size, s.backend, s.host_syncs_per_pass) == ("dflash2", 4, "cpu", 1.0)


@pytest.mark.parametrize("B, n, schedule", [
    (4, 9, lambda c: c % 4),  # the last block is cut by max_tokens
    (6, 40, lambda c: (3 * c + 1) % 7),
    (16, 33, lambda c: (5 * c) % 17),
    (2, 13, lambda c: c % 3),
])
def test_acceptance_stats_match_decode_steps(pair, B, n, schedule):
    target, tok, base = pair
    prompt = [5, 80, 81, 200]
    reference = ar_tokens(target, prompt, n + 16)
    make = lambda: ScriptedDrafter(base, reference, len(prompt), schedule, target.vocab_size)
    steps = list(decode_steps(prompt, Pair.make(target, make()), DecodeRequest(max_tokens=n, block_size=B)))
    rs = run(target, tok, prompt, drafter=make(), max_tokens=n, block_size=B)
    assert token_ids(rs) == [t for s in steps for t in s.tokens] == reference[:n]
    assert [r.from_draft for r in rs] == [f for s in steps for f in s.from_draft]
    s = rs[-1].stats
    want = expected_from_steps(steps)
    assert s.target_passes == want["target_passes"] == len(steps) - 1
    assert s.acceptance_histogram == want["acceptance_histogram"]
    assert sum(s.acceptance_histogram) == s.target_passes
    assert len(s.acceptance_histogram) == B and len(s.acceptance_by_position) == B - 1
    assert s.mean_acceptance_length == pytest.approx(want["mean_acceptance_length"])
    assert s.mean_acceptance_length == pytest.approx((s.generation_tokens - 1) / s.target_passes)
    assert s.acceptance_by_position == pytest.approx(want["acceptance_by_position"])
    assert (s.drafted, s.accepted) == (want["drafted"], want["accepted"])
    assert s.host_syncs_per_pass == 1.0 and s.block_size == B and s.generation_tokens == n
    if (B, n) == (4, 9):  # hand-computed: cycles accept 0, 1, 2, then 2 of 2 (cut to 2 tokens)
        assert s.acceptance_histogram == [1, 2, 1, 0]
        assert s.acceptance_by_position == pytest.approx([3 / 4, 2 / 3, 0.0])
        assert s.mean_acceptance_length == pytest.approx(8 / 4)


@pytest.mark.parametrize("mode", ["ar", "dflash2", "dflash2-scripted"])
@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_max_tokens_gives_exactly_that_many(pair, mode, n):
    target, tok, base = pair
    prompt = [5, 6, 7]
    # "dflash2-scripted" drafts the target's own continuation with one wrong token per
    # cycle: drafts are accepted, and max_tokens can cut a block short.
    reference = ar_tokens(target, prompt, n + 16) if mode == "dflash2-scripted" else None
    make = lambda: (None if mode == "ar" else base if mode == "dflash2" else
                    ScriptedDrafter(base, reference, len(prompt), lambda c: c % 4, target.vocab_size))
    rs = run(target, tok, prompt, drafter=make(), max_tokens=n)
    assert len(rs) == n and rs[-1].finish_reason == "length"
    assert rs[-1].stats.generation_tokens == n
    assert [r.generation_tokens for r in rs] == list(range(1, n + 1))
    s = rs[-1].stats
    if mode == "ar":
        assert s.target_passes == n - 1
    else:
        # Counted independently: the decode loop yields one step per target pass after the prefill token...
        steps = list(decode_steps(prompt, Pair.make(target, make()), DecodeRequest(max_tokens=n, block_size=None)))
        assert [t for step in steps for t in step.tokens] == token_ids(rs)
        assert s.target_passes == len(steps) - 1
        # ...and each pass commits its accepted drafts then the target's own token, unless max_tokens
        # cut the last block first: passes = tokens after the prefill - accepted drafts (+ a cut pass).
        accepted = sum(r.from_draft for r in rs)
        cut = int(rs[-1].from_draft)
        assert s.target_passes == n - 1 - accepted + cut
        if accepted > cut:  # drafts were accepted: fewer passes than tokens
            assert s.target_passes < n - 1
    assert sum((k + 1) * c for k, c in enumerate(s.acceptance_histogram)) == n - 1


@pytest.mark.parametrize("mode, B", [("ar", 1), ("dflash2", 5), ("dflash2", 7)])
def test_eos_stops_generation(pair, mode, B):
    base_target, tok, base_drafter = pair
    before = tok.encode("    return x , y\n", add_special_tokens=False)
    script = before + [EOS_ID] + tok.encode("never shown\n", add_special_tokens=False)
    target, drafter, prompt = scripted(base_target, base_drafter, tok, script, mode, B=B,
                                       schedule=never)
    rs = run(target, tok, prompt, drafter=drafter, max_tokens=len(script),
             block_size=None if mode == "ar" else B)
    assert token_ids(rs) == before + [EOS_ID]
    assert rs[-1].finish_reason == "stop" and rs[-1].stats is not None
    assert joined(rs) == tok.decode(before) == "    return x , y\n"
    s = rs[-1].stats
    assert s.generation_tokens == len(before) + 1
    if mode != "ar":
        # EOS lands inside a fully accepted block: only the tokens up to it count.
        assert len(before) % B != 0  # the EOS is not the last token of its block
        assert sum(s.acceptance_histogram) == s.target_passes
        assert sum((k + 1) * c for k, c in enumerate(s.acceptance_histogram)) == s.generation_tokens - 1
        assert s.mean_acceptance_length == pytest.approx((s.generation_tokens - 1) / s.target_passes)
        # Every draft is right: each block is B-1 drafted tokens then the bonus; EOS was drafted.
        assert [r.from_draft for r in rs] == [i % B != 0 for i in range(len(rs))]


def test_eos_flushes_text_held_for_a_stop_string(pair):
    base_target, tok, base_drafter = pair
    before = tok.encode("y . z", add_special_tokens=False)
    target, drafter, prompt = scripted(base_target, base_drafter, tok, before + [EOS_ID, 5, 6], "ar")
    rs = run(target, tok, prompt, max_tokens=10, stop=["z!!"])
    assert joined(rs) == "y . z" and rs[-1].finish_reason == "stop"


# -- stop strings ------------------------------------------------------------------------------


def _span(tok, ids, stop):
    """Indices of the tokens covered by the first occurrence of `stop` in decode(ids)."""
    text = tok.decode(ids)
    at = text.index(stop)
    ends = [len(tok.decode(ids[: k + 1])) for k in range(len(ids))]
    first = next(k for k, e in enumerate(ends) if e > at)
    last = next(k for k, e in enumerate(ends) if e >= at + len(stop))
    return first, last


@pytest.mark.parametrize("mode", ["ar", "dflash2"])
@pytest.mark.parametrize("stop, tokens_spanned", [("urn", 2), ("x , y", 5), ("ur", 1)])
def test_stop_string_cuts_text(pair, mode, stop, tokens_spanned):
    base_target, tok, base_drafter = pair
    text = "    return x , y . z\n"
    script = tok.encode(text, add_special_tokens=False)
    first, last = _span(tok, script, stop)
    assert last - first + 1 == tokens_spanned  # the stop string really spans that many tokens
    target, drafter, prompt = scripted(base_target, base_drafter, tok, script, mode, schedule=never)
    rs = run(target, tok, prompt, drafter=drafter, max_tokens=len(script), stop=[stop], block_size=4)
    assert joined(rs) == text[: text.index(stop)]
    assert rs[-1].finish_reason == "stop"
    assert token_ids(rs) == script[: last + 1]  # stops at the token completing the stop string
    assert rs[-1].stats.generation_tokens == last + 1
    if mode == "dflash2":
        s = rs[-1].stats
        assert sum((k + 1) * c for k, c in enumerate(s.acceptance_histogram)) == last


@pytest.mark.parametrize("mode", ["ar", "dflash2"])
def test_multibyte_stop_string_split_across_byte_tokens(pair, mode):
    base_target, tok, base_drafter = pair
    script = tok.encode(CODE, add_special_tokens=False)
    stop = "語'"  # 3 byte tokens for the character, then the quote
    first, last = _span(tok, script, stop)
    assert last - first + 1 == 4
    target, drafter, prompt = scripted(base_target, base_drafter, tok, script, mode)
    rs = run(target, tok, prompt, drafter=drafter, max_tokens=len(script), stop=[stop], block_size=4)
    assert joined(rs) == CODE[: CODE.index(stop)] and rs[-1].finish_reason == "stop"
    assert token_ids(rs) == script[: last + 1]


@pytest.mark.parametrize("mode", ["ar", "dflash2"])
def test_partial_stop_matches_are_released(pair, mode):
    """Text held back because it might start a stop string comes out when it does not,
    including at max_tokens."""
    base_target, tok, base_drafter = pair
    text = "    return x , y . z"
    script = tok.encode(text, add_special_tokens=False)
    target, drafter, prompt = scripted(base_target, base_drafter, tok, script, mode)
    rs = run(target, tok, prompt, drafter=drafter, max_tokens=len(script), block_size=4,
             stop=["retry", "x ,!", "z!!"])
    assert joined(rs) == text and rs[-1].finish_reason == "length"
    assert token_ids(rs) == script


def test_stop_strings_cut_at_the_earliest_match_whatever_their_order(pair):
    """Two stop strings completed by the same token: cut before the earlier one."""
    base_target, tok, _ = pair
    text = "    return x , y"
    script = tok.encode(text, add_special_tokens=False)
    target, _, prompt = scripted(base_target, None, tok, script, "ar")
    outs = {
        order: joined(run(target, tok, prompt, max_tokens=len(script), stop=list(order)))
        for order in [("x", " x"), (" x", "x")]
    }
    assert outs[("x", " x")] == outs[(" x", "x")] == "    return"


# -- sampling, errors ------------------------------------------------------------------


def _record(rs):
    s = rs[-1].stats.to_dict()
    for timing in ("prompt_tps", "generation_tps", "peak_memory_gb"):
        s.pop(timing)
    return token_ids(rs), [r.from_draft for r in rs], joined(rs), s


@pytest.mark.parametrize("mode", ["ar", "dflash2"])
def test_seeded_sampling_is_reproducible(pair, mode):
    target, tok, drafter = pair
    d = None if mode == "ar" else drafter
    sample = lambda seed: _record(run(target, tok, [9, 10, 11], drafter=d, max_tokens=24,
                                      sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=seed)))
    first = sample(7)
    assert sample(7) == first
    s = first[3]
    assert s["mode"] == mode and s["generation_tokens"] == 24
    assert sum(s["acceptance_histogram"]) == s["target_passes"]
    assert s["mean_acceptance_length"] == pytest.approx(23 / s["target_passes"])
    assert s["host_syncs_per_pass"] == (None if mode == "ar" else 1.0)
    assert any(sample(seed)[0] != first[0] for seed in (1, 2, 3))


def test_default_block_size_and_mode(pair, dflash_pair):
    target, tok, drafter = pair
    s = run(target, tok, [3, 4], drafter=drafter, max_tokens=20)[-1].stats
    assert s.block_size == drafter.config.block_size == 16 and s.mode == "dflash2"
    assert len(s.acceptance_by_position) == 15 and s.host_syncs_per_pass == 1.0
    target1, tok1, drafter1 = dflash_pair
    s1 = run(target1, tok1, [3, 4], drafter=drafter1, max_tokens=20, block_size=5)[-1].stats
    assert (s1.mode, s1.block_size, s1.host_syncs_per_pass) == ("dflash", 5, 1.0)
    ar = run(target, tok, [3, 4], max_tokens=20)[-1].stats
    assert (ar.mode, ar.target_passes, ar.host_syncs_per_pass, ar.backend) == ("ar", 19, None, "cpu")
    assert ar.mean_acceptance_length == 1.0 and ar.acceptance_by_position == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_size=1), "block_size 1 is outside"),
    (dict(block_size=17), "block_size 17 is outside"),
    (dict(max_tokens=0), "max_tokens"),
])
def test_bad_arguments_raise_dflash_errors(pair, kwargs, match):
    target, tok, drafter = pair
    with pytest.raises(DFlashError, match=match):
        run(target, tok, [1, 2], drafter=drafter, **kwargs)


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt_is_a_dflash_error(pair, prompt):
    target, tok, drafter = pair
    with pytest.raises(DFlashError, match="empty"):
        run(target, tok, prompt, drafter=drafter)
