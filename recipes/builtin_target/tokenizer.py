"""Train the byte-level BPE tokenizer and encode the corpus to token streams.

Usage: python tokenizer.py RUN_DIR
  reads RUN_DIR/corpus.json (from corpus.py), writes RUN_DIR/tokenizer/ (the files
  shipped with the model) and RUN_DIR/{train,heldout}.npy (uint16 token ids, one
  <|endoftext|> after every file).

Byte-level BPE (GPT-2 style pre-tokenizer, no prefix space) so any text,
including exotic whitespace, round-trips exactly. Id 0 is <|endoftext|> (EOS,
also used as padding) and id 1 is <|mask|>, reserved for the drafter's mask
token: being in the vocabulary it gets a real embedding row in the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402

VOCAB_SIZE = 4096
EOS, MASK = "<|endoftext|>", "<|mask|>"

# Written by hand (not by transformers' save_pretrained / mlx_lm.convert) so the
# same file loads in transformers 4.x and 5.x and in mlx_lm.load.
# clean_up_tokenization_spaces must be false: the legacy clean-up rewrites " ."
# to "." and would break code round-trips.
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": EOS,
    "pad_token": EOS,
    "mask_token": MASK,
    "unk_token": None,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 2048,
}
SPECIAL_TOKENS_MAP = {"eos_token": EOS, "pad_token": EOS, "mask_token": MASK}


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS, MASK],  # ids 0 and 1, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS_MAP, indent=2) + "\n")


def encode_stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def check_round_trip(tok: Tokenizer, texts: list[str]) -> None:
    for t in texts:
        if tok.decode(tok.encode(t).ids, skip_special_tokens=False) != t:
            raise SystemExit("tokenizer round-trip failed")


def main(run_dir: Path) -> None:
    info = json.loads((run_dir / "corpus.json").read_text())
    train = corpus.read(info["root"], info["train"])
    held = corpus.read(info["root"], info["heldout"])
    tok = train_tokenizer(train)  # held-out text never shapes the merges
    assert tok.token_to_id(EOS) == 0 and tok.token_to_id(MASK) == 1
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    check_round_trip(tok, held)  # every held-out file, indentation included
    save(tok, run_dir / "tokenizer")
    tr, ho = encode_stream(tok, train), encode_stream(tok, held)
    np.save(run_dir / "train.npy", tr)
    np.save(run_dir / "heldout.npy", ho)
    stats = {
        "vocab_size": tok.get_vocab_size(),
        "eos_id": 0,
        "mask_id": 1,
        "train_tokens": int(tr.size),
        "heldout_tokens": int(ho.size),
        "train_bytes": sum(len(t.encode()) for t in train),
        "heldout_bytes": sum(len(t.encode()) for t in held),
    }
    (run_dir / "tokens.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
