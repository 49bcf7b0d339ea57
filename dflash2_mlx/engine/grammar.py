"""Structured output: a grammar that masks the target's distribution.

The grammar engine is llguidance (guidance-ai, the engine llama.cpp, vLLM and
SGLang also use): a Rust matcher that computes the allowed-token mask of a
JSON schema, a regex or a Lark grammar in tens of microseconds, and can
consume tokens and roll them back, which is what verifying a drafted block
needs (docs/structured.md says why it was chosen over xgrammar and
outlines-core).

`Grammar` is what a request asks for, compiled once; `GrammarState` is one
generation's matcher over the target's vocabulary. Its state always stands
after the committed tokens: a cycle advances it along the drafted tokens to
read each verified row's mask, then rolls all of them back; the commit tail
advances it by what was committed.
"""

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from ..errors import DFlashError

KINDS = ("json_schema", "json_object", "regex", "lark")
# JSON in its compact layout (no whitespace between tokens): a model may not spend its tokens on
# whitespace the schema does not care about, or loop on it.
JSON_LAYOUT = {"whitespace_flexible": False}


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401  (the tokenizer bridge)
    except ImportError as e:  # a dependency; only a broken install lacks it
        raise DFlashError(f"structured output needs the llguidance package ({e}): pip install llguidance") from e
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A constraint on the output: `kind` one of KINDS, `source` its text
    (a JSON schema as JSON text, a regex, a Lark grammar; unused for json_object)."""

    kind: str
    source: str = ""

    @classmethod
    def json_schema(cls, schema) -> "Grammar":
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> "Grammar":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Grammar":
        return cls("regex", pattern)

    def compiled(self) -> str:
        """The llguidance grammar text; a DFlashError says what is wrong with it."""
        matcher_cls = _llguidance().LLMatcher
        try:
            if self.kind == "json_schema":
                schema = json.loads(self.source)
                if not isinstance(schema, dict):
                    raise ValueError("a JSON schema is an object")
                text = matcher_cls.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
            elif self.kind == "json_object":
                text = matcher_cls.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
            elif self.kind == "regex":
                text = matcher_cls.grammar_from_regex(self.source)
            elif self.kind == "lark":
                text = matcher_cls.grammar_from_lark(self.source)
            else:
                raise ValueError(f"unknown kind {self.kind!r} (one of {', '.join(KINDS)})")
        except (ValueError, TypeError) as e:
            raise DFlashError(f"the {self.kind.replace('_', ' ')} cannot be used as a grammar: {e}") from None
        failed, messages = matcher_cls.validate_grammar_with_warnings(text)
        if failed:
            raise DFlashError(f"the {self.kind.replace('_', ' ')} cannot be used as a grammar: {_one_line(messages[0])}")
        return text


def _one_line(message: str) -> str:
    """llguidance's message in one line: its first line, and the parser's own "error:" line
    when the first ends by pointing at it (a regex's or a Lark grammar's position)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = lines[0] if lines else message
    cause = next((line[len("error:"):].strip() for line in lines[1:] if line.startswith("error:")), None)
    return f"{first.rstrip(':')}: {cause}" if cause else first


# One llguidance tokenizer per (tokenizer, vocabulary): building it reads the whole vocabulary.
_TOKENIZERS: dict = {}


def _grammar_tokenizer(tokenizer, vocab_size: int):
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper holds the HF one
    key = (id(hf), vocab_size)
    entry = _TOKENIZERS.get(key)
    if entry is None or entry[0] is not hf:
        eos = sorted(getattr(tokenizer, "eos_token_ids", None) or []) or [hf.eos_token_id]
        n_vocab = max(len(hf), vocab_size)
        entry = (hf, _llguidance().hf.from_tokenizer(hf, n_vocab=n_vocab, eos_token=eos), eos)
        _TOKENIZERS.clear()  # one at a time: a server serves one tokenizer
        _TOKENIZERS[key] = entry
    return entry[1], entry[2]


class GrammarState:
    """One generation's grammar over a vocabulary of `vocab_size` (the target's
    logit width; rows past the tokenizer are never allowed)."""

    def __init__(self, grammar: Grammar, tokenizer, vocab_size: int):
        llg = _llguidance()
        lltok, eos = _grammar_tokenizer(tokenizer, vocab_size)
        self.eos = frozenset(eos)
        self.vocab_size = vocab_size
        self._matcher = llg.LLMatcher(lltok, grammar.compiled(), log_level=0)
        self._ended = False
        self._check()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise DFlashError(f"the grammar failed: {self._matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The output is complete: an end-of-sequence token was consumed (once the grammar
        takes nothing more it allows only that token, as in constrained plain decoding)."""
        return self._ended

    def allowed(self) -> np.ndarray:
        """bool [vocab_size]: the tokens the grammar allows next."""
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        out = np.zeros(self.vocab_size, dtype=bool)
        n = min(bits.size, self.vocab_size)
        out[:n] = bits[:n].astype(bool)
        return out

    def fork(self) -> "GrammarState":
        """An independent copy at this state (a tree's branches each advance their own)."""
        other = object.__new__(GrammarState)
        other.eos, other.vocab_size, other._ended = self.eos, self.vocab_size, self._ended
        other._matcher = self._matcher.deep_copy()
        return other

    def forced(self) -> Optional[int]:
        """The next token of the canonical tokenization of the bytes the grammar forces now
        (a literal, a key, a closing brace), or None when the next bytes are the model's choice."""
        tokens = self._matcher.compute_ff_tokens()
        return int(tokens[0]) if tokens else None

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume committed (or drafted) tokens, which the grammar allowed."""
        for t in (int(t) for t in tokens):
            if t in self.eos and self._matcher.is_stopped():
                self._ended = True  # a complete grammar's one allowed token; the matcher takes no more
            elif not self._matcher.consume_token(t):
                self._check()
                raise DFlashError("internal: a token the grammar did not allow reached it")
            else:
                self._ended = self._ended or t in self.eos

    def rollback(self, n: int) -> None:
        """Forget the last `n` tokens advanced (drafted ones; never past an end of sequence)."""
        if n > 0 and not self._matcher.rollback(n):
            self._check()


class PathGrammar:
    """The grammar's state after each path of drafted tokens (memoised), for draft
    trees: `admits(path, token)` says whether `token` may follow the drafted tokens
    `path`, `allowed(path)` is the mask of the row that follows them. The state
    passed in is never changed."""

    def __init__(self, grammar: GrammarState):
        self.eos = grammar.eos
        self._states = {(): grammar.fork()}
        self._masks: dict = {}

    def allowed(self, path: tuple) -> np.ndarray:
        if path not in self._masks:
            self._masks[path] = self._state(path).allowed()
        return self._masks[path]

    def admits(self, path: tuple, token: int) -> bool:
        # No draft past an end of sequence (the target's own pick may still be one).
        return token not in self.eos and bool(self.allowed(path)[token])

    def _state(self, path: tuple) -> GrammarState:
        if path not in self._states:
            state = self._state(path[:-1]).fork()
            state.advance([path[-1]])
            self._states[path] = state
        return self._states[path]


def masked(logits: mx.array, allowed) -> mx.array:
    """`logits` [..., V] with every token the grammar forbids at -inf (allowed: bool [..., V])."""
    return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))


def only_token(allowed: np.ndarray) -> Optional[int]:
    """The one token the grammar allows, when it allows exactly one (it is forced)."""
    hits = np.flatnonzero(allowed)
    return int(hits[0]) if hits.size == 1 else None
