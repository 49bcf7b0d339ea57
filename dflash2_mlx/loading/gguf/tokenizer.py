"""The tokenizer in a GGUF file's metadata, rebuilt with the `tokenizers` library.

Two kinds, as llama.cpp names them in `tokenizer.ggml.model`:
- "gpt2", byte-level BPE (tokens, merges): the text is split before BPE the way the
  original tokenizer did, which llama.cpp records by name in `tokenizer.ggml.pre` (the
  patterns below are the ones the original tokenizer.json files carry);
- "llama", SentencePiece (Llama 2, Mistral, Gemma, Phi-3): tokens with scores and byte
  pieces, no merges. SentencePiece's BPE joins the pair whose result scores highest, so
  the merges are rebuilt from the scores (Gemma's scores do not follow its merge order:
  its vocabulary order does), as Hugging Face builds those models' tokenizer.json.
  Spaces become "▁"; where the prefix space comes from differs per family (spm_text).
"""

import json
from pathlib import Path

from ...errors import ConfigError
from .config import value

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (llama.cpp's llama_token_type)

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# Mistral's Tekken vocabulary (Nemo, Small): letters split by case as in its tokenizer.json.
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str):
    """(pre-tokenizer, ignore_merges) for a `tokenizer.ggml.pre` name, None if unknown."""
    from tokenizers import Regex, pre_tokenizers as p

    if pre in ("gpt2", "default"):
        return p.ByteLevel(add_prefix_space=False, use_regex=True), False
    if pre == "smollm":  # SmolLM's tokenizer.json: digits one by one, then GPT-2's split
        return p.Sequence([p.Digits(individual_digits=True), p.ByteLevel(add_prefix_space=False, use_regex=True)]), False
    if pre in ("qwen2", "llama-bpe", "tekken"):
        pattern = {"qwen2": _QWEN2, "llama-bpe": _LLAMA3, "tekken": _TEKKEN}[pre]
        split = p.Split(Regex(pattern), behavior="isolated", invert=False)
        return p.Sequence([split, p.ByteLevel(add_prefix_space=False, use_regex=False)]), pre == "llama-bpe"
    return None


KNOWN_PRE = ("gpt2", "default", "smollm", "qwen2", "llama-bpe", "tekken")


def build_tokenizer(metadata: dict, where: str):
    """A `tokenizers.Tokenizer` equal to the file's vocabulary, merges and special tokens."""
    from tokenizers import Tokenizer, decoders, models, processors

    kind = value(metadata, "tokenizer.ggml.model")
    if kind == "llama":
        return build_spm_tokenizer(metadata, where)
    if kind != "gpt2":
        raise ConfigError(f"GGUF '{where}' has a {kind!r} tokenizer; byte-level BPE ('gpt2') and SentencePiece "
                          "('llama') ones are built here: use an mlx-lm folder of the model (its tokenizer.json)")
    pre = value(metadata, "tokenizer.ggml.pre", "default")
    built = _pre_tokenizer(pre)
    if built is None:
        raise ConfigError(f"GGUF '{where}' splits text with llama.cpp's '{pre}' rule, which is not mapped here "
                          f"(known: {', '.join(KNOWN_PRE)}): use an mlx-lm folder of the model instead")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    types = _token_types(metadata, len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConfigError(f"GGUF '{where}' lists a token twice in its vocabulary: it cannot be a BPE tokenizer")
    pre_tokenizer, ignore_merges = built
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                     ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    _added_tokens(tokenizer, tokens, types)
    if not _bos_processor(tokenizer, metadata, tokens, default=False):
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _token_types(metadata: dict, count: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    return [int(t) for t in types] if types is not None else [1] * count


def _added_tokens(tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens as special added tokens, user-defined ones (`<think>`) as plain added
    tokens: llama.cpp matches both whole in the text."""
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, types) if k == CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, k in zip(tokens, types) if k == USER_DEFINED])


def _bos_processor(tokenizer, metadata: dict, tokens: list[str], default: bool) -> bool:
    """Prepend BOS when the file says so (llama.cpp's default: on for SentencePiece, off for BPE)."""
    from tokenizers import processors

    bos = value(metadata, "tokenizer.ggml.bos_token_id")
    if not value(metadata, "tokenizer.ggml.add_bos_token", default) or bos is None:
        return False
    b = tokens[int(bos)]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{b} $A", pair=f"{b} $A {b} $B", special_tokens=[(b, int(bos))])
    return True


def spm_merges(vocab: dict[str, int], priority: list[float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's highest-score-first joining: every split of a
    token into two tokens, ordered by the joined token's priority (then as Hugging Face's
    `generate_merges` orders ties, so the ids match its tokenizers). `vocab`: token -> id, in id order."""
    merges = []
    for token, score in zip(vocab, priority):
        local = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += [(left, right, score) for left, right in local]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def build_spm_tokenizer(metadata: dict, where: str):
    """A SentencePiece vocabulary as a `tokenizers` BPE with byte fallback."""
    from tokenizers import Tokenizer, models

    tokens = list(metadata["tokenizer.ggml.tokens"])
    family = value(metadata, "general.architecture", "llama")
    gemma = family.startswith("gemma")
    if gemma:  # Gemma stores runs of spaces as spaces; its pieces spell them "▁"
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
        priority = [-i for i in range(len(tokens))]
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        if scores is None:
            raise ConfigError(f"GGUF '{where}' has a SentencePiece vocabulary without scores: it is incomplete "
                              "(download it again)")
        priority = [float(s) for s in scores]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConfigError(f"GGUF '{where}' lists a token twice in its vocabulary: it cannot be a BPE tokenizer")
    unk = value(metadata, "tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(vocab, priority), fuse_unk=True,
                                     byte_fallback=True, unk_token=tokens[int(unk)] if unk is not None else None))
    spm_text(tokenizer, family, bool(value(metadata, "tokenizer.ggml.add_space_prefix", True)))
    _added_tokens(tokenizer, tokens, _token_types(metadata, len(tokens)))
    _bos_processor(tokenizer, metadata, tokens, default=True)
    return tokenizer


def spm_text(tokenizer, family: str, space_prefix: bool) -> None:
    """Spaces as "▁" and the prefix space as each family's tokenizer.json has them: Llama 2 and
    Mistral prefix the text's first piece (Metaspace); Gemma adds none; Phi-3 prefixes in its
    normalizer (which also prefixes text after a special token)."""
    from tokenizers import decoders, normalizers, pre_tokenizers

    spaces = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if family.startswith("gemma"):
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.decoder = decoders.Sequence(spaces)
        return
    tokenizer.decoder = decoders.Sequence(spaces + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))
    if family == "phi3":
        tokenizer.normalizer = normalizers.Sequence(
            ([normalizers.Prepend("\u2581")] if space_prefix else []) + [normalizers.Replace(" ", "\u2581")])
        return
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if space_prefix else "never", split=False)


def tokenizer_config(metadata: dict, context: int) -> dict:
    """tokenizer_config.json: special token names, BOS handling, chat template."""
    tokens = metadata["tokenizer.ggml.tokens"]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": context,
              "add_bos_token": bool(value(metadata, "tokenizer.ggml.add_bos_token",
                                          value(metadata, "tokenizer.ggml.model") == "llama"))}
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
