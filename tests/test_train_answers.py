"""Training blocks lie where the target writes: inside the answers (train/data.py
pack_examples, train/packing.py sample_anchors). At inference every block's anchor is a token
the target committed and its labels are what it writes next; a block drawn in a prompt would
teach the drafter to guess the user's words, and one in the chat template would score recall
that decoding never sees."""

import json

import numpy as np
from mlx_lm.utils import load_tokenizer

from dflash2_mlx.train.data import Example, pack_examples
from dflash2_mlx.train.packing import sample_anchors
from dflash2_mlx.train.setup import prepare
from dflash2_mlx.train.trainer import TrainConfig
from helpers import target_folder

PROMPT, RESPONSE, TEXT = "Q: what is a list?\n", "A list holds items in order.", "Plain text, all of it imitated."


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_answers_are_the_responses_their_eos_and_plain_texts():
    tokenizer = load_tokenizer(target_folder("qwen3"))
    asked, whole, plain = encode(tokenizer, PROMPT), encode(tokenizer, PROMPT + RESPONSE), encode(tokenizer, TEXT)
    assert whole[: len(asked)] == asked  # the prompt's tokens begin the example's: a clean boundary
    examples = [Example(PROMPT, RESPONSE, "a"), Example(TEXT, "", "b")] * 8
    packed = pack_examples(examples, tokenizer, 16, eos_id=0)
    # The tokens: each example and its EOS, one stream cut into rows (the feature store is keyed by them).
    stream = (whole + [0] + plain + [0]) * 8
    assert packed.tokens.reshape(-1).tolist() == stream[: packed.tokens.size]
    one = [False] * len(asked) + [True] * (len(whole) - len(asked) + 1) + [True] * (len(plain) + 1)
    assert packed.answers.reshape(-1).tolist() == (one * 8)[: packed.answers.size]


def test_anchored_blocks_lie_inside_the_answers_and_repeat_by_key():
    B, L = 4, 32
    answers = np.zeros((3, L), dtype=bool)
    answers[0, 10:20] = True  # anchors 10..16 fit a block of 4
    answers[1, 5:8] = answers[1, 20:30] = True  # a run too short for a block, then anchors 20..26
    keys = [[0, 1, 0], [0, 1, 1], [0, 1, 2]]  # row 2 holds no answer: anchors anywhere
    seq, anchors = sample_anchors(keys, L, B, 64, answers)
    for s, a in zip(seq, anchors):
        assert 1 <= a <= L - B
        if s < 2:
            assert answers[s, a : a + B].all(), (s, a)
    assert set(anchors[seq == 0]) == set(range(10, 17)) and set(anchors[seq == 1]) == set(range(20, 27))
    assert len(set(anchors[seq == 2])) > 7  # anywhere: more places than either answer holds
    again = sample_anchors(keys, L, B, 64, answers)
    assert np.array_equal(again[1], anchors)


def test_the_trainer_draws_its_blocks_inside_the_answers(tmp_path):
    data = tmp_path / "answers.jsonl"
    rows = [{"prompt": f"Q{i}: tell me about item number {i} in the list, please.\n",
             "response": f"Item {i} is " + " ".join(["fine"] * (i % 5 + 3)) + "."} for i in range(80)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = TrainConfig(steps=1, batch_size=4, blocks_per_seq=8, eval_every=1, save_every=1)
    t = prepare(str(target_folder("qwen3")), [str(data)], tmp_path / "run", kind="dflash2", num_layers=1,
                block_size=4, seq_len=64, selector_rank=32, config=config)
    for source in (t.sequences, t.heldout):
        answers = t.answers[id(source)]
        assert 0.2 < answers.mean() < 0.8  # prompts and answers both present
        rows = np.arange(min(4, len(source)))
        *_, seq, anchors = t._batch(rows, [[0, 0, int(r)] for r in rows], source)
        for s, a in zip(np.array(seq), np.array(anchors)):
            assert answers[rows[s], a : a + 4].all(), (int(s), int(a))


def test_analyze_scores_the_blocks_the_trainer_scores(tmp_path, monkeypatch):
    """`dflash2 analyze` is the trainer's held-out evaluation again: its teacher-forced recall
    draws every block inside the answers too, or it would count blocks decoding never sees."""
    import dflash2_mlx.tools.analyze as analysis
    from dflash2_mlx.engine.pair import Pair
    from helpers import load_pair_for

    data = tmp_path / "answers.jsonl"
    rows = [{"prompt": f"Q{i}: what comes after number {i} in the list, please?\n",
             "response": f"After {i} comes " + " ".join(["then"] * (i % 4 + 20)) + "."} for i in range(40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target, tokenizer, drafter = load_pair_for("qwen3", "dflash2")
    heldout = analysis.heldout_sequences([str(data)], tokenizer, 64, 1.0)
    assert 0.2 < heldout.answers.mean() < 0.8  # prompts and answers both present
    drawn = []

    def recorded(keys, seq_len, block_size, per_seq, answers=None):
        seq, anchors = sample_anchors(keys, seq_len, block_size, per_seq, answers)
        drawn.append((np.array([k[-1] for k in keys])[seq], anchors, block_size))
        return seq, anchors

    monkeypatch.setattr(analysis, "sample_anchors", recorded)
    analysis.analyze({"dflash2": Pair.make(target, drafter)}, heldout, prompt_len=8, n_prompts=1,
                     max_tokens=4, blocks_per_seq=4, cycles=1, cycle_repeats=1)
    assert drawn
    checked = 0
    for rows, anchors, B in drawn:
        runs = np.lib.stride_tricks.sliding_window_view(heldout.answers, B, axis=1).all(-1)
        for r, a in zip(rows, anchors):
            if runs[r, 1:].any():  # a row whose answers hold a block (others: anywhere, as in training)
                assert heldout.answers[r, a : a + B].all(), (int(r), int(a))
                checked += 1
    assert checked > len(heldout.tokens)  # most rows hold one
