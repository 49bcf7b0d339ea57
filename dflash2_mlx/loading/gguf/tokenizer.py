"""The tokenizer in a GGUF file's metadata, rebuilt with the `tokenizers` library.

Only llama.cpp's "gpt2" kind (byte-level BPE: tokens, merges) is built; the
text is split before BPE the way the original tokenizer did, which llama.cpp
records by name in `tokenizer.ggml.pre` (the patterns below are the ones the
original tokenizer.json files carry).
"""

import json
from pathlib import Path

from ...errors import ConfigError
from .config import value

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (llama.cpp's llama_token_type)

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str):
    """(pre-tokenizer, ignore_merges) for a `tokenizer.ggml.pre` name, None if unknown."""
    from tokenizers import Regex, pre_tokenizers as p

    if pre in ("gpt2", "default"):
        return p.ByteLevel(add_prefix_space=False, use_regex=True), False
    if pre == "smollm":  # SmolLM's tokenizer.json: digits one by one, then GPT-2's split
        return p.Sequence([p.Digits(individual_digits=True), p.ByteLevel(add_prefix_space=False, use_regex=True)]), False
    if pre in ("qwen2", "llama-bpe"):
        pattern = _QWEN2 if pre == "qwen2" else _LLAMA3
        split = p.Split(Regex(pattern), behavior="isolated", invert=False)
        return p.Sequence([split, p.ByteLevel(add_prefix_space=False, use_regex=False)]), pre == "llama-bpe"
    return None


KNOWN_PRE = ("gpt2", "default", "smollm", "qwen2", "llama-bpe")


def build_tokenizer(metadata: dict, where: str):
    """A `tokenizers.Tokenizer` equal to the file's vocabulary, merges and special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = value(metadata, "tokenizer.ggml.model")
    if kind != "gpt2":
        what = "SentencePiece ('llama')" if kind == "llama" else repr(kind)
        raise ConfigError(f"GGUF '{where}' has a {what} tokenizer; only byte-level BPE ('gpt2') ones are built "
                          "here: use an mlx-lm folder of the model (its tokenizer.json) instead")
    pre = value(metadata, "tokenizer.ggml.pre", "default")
    built = _pre_tokenizer(pre)
    if built is None:
        raise ConfigError(f"GGUF '{where}' splits text with llama.cpp's '{pre}' rule, which is not mapped here "
                          f"(known: {', '.join(KNOWN_PRE)}): use an mlx-lm folder of the model instead")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    types = metadata.get("tokenizer.ggml.token_type")
    types = types.tolist() if types is not None else [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConfigError(f"GGUF '{where}' lists a token twice in its vocabulary: it cannot be a BPE tokenizer")
    pre_tokenizer, ignore_merges = built
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                     ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, types) if k == CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, k in zip(tokens, types) if k == USER_DEFINED])
    bos = value(metadata, "tokenizer.ggml.bos_token_id")
    if value(metadata, "tokenizer.ggml.add_bos_token", False) and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B", special_tokens=[(tokens[bos], bos)])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def tokenizer_config(metadata: dict, context: int) -> dict:
    """tokenizer_config.json: special token names, BOS handling, chat template."""
    tokens = metadata["tokenizer.ggml.tokens"]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": context,
              "add_bos_token": bool(value(metadata, "tokenizer.ggml.add_bos_token", False))}
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        token = value(metadata, f"tokenizer.ggml.{key}_token_id")
        if token is not None and 0 <= int(token) < len(tokens):
            config[name] = tokens[int(token)]
    template = value(metadata, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


def write_tokenizer(metadata: dict, folder: Path, context: int, where: str) -> None:
    build_tokenizer(metadata, where).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(metadata, context), indent=2))
