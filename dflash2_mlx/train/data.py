"""Training data: text or JSONL files -> fixed-length token sequences.

JSONL lines may hold `text`, or `prompt` and `response`/`completion`, or chat
`messages`. With regeneration, each prompt is completed by the target itself
(batched) so the drafter learns the target's own distribution.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import DFlashError


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str = ""
    source: str = ""  # file (and line) it came from: the held-out split is by source


def read_examples(paths: Sequence[str]) -> list[Example]:
    examples = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl", ".py", ".md"))
        elif path.is_file():
            files = [path]
        else:
            raise DFlashError(f"training data '{raw}' does not exist")
        for f in files:
            examples.extend(_read_file(f))
    examples = [e for e in examples if (e.prompt + e.response).strip()]
    if not examples:
        raise DFlashError(f"the training data in {', '.join(paths)} is empty: give text or JSONL files with content")
    return examples


def _read_file(f: Path) -> list[Example]:
    raw = f.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DFlashError(f"{f}:{line} is not UTF-8 text (byte 0x{raw[e.start]:02x}): save the file as UTF-8") from None
    if f.suffix != ".jsonl":
        return [Example(text, source=str(f))]
    out = []
    # "\n" only: str.splitlines would also cut at U+2028 and friends, which JSON strings may hold.
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise DFlashError(f"{f}:{n} is not valid JSON") from None
        out.append(_row_example(row, f"{f}:{n}"))
    return out


_ROW_KINDS = 'a JSON object with "text", "prompt" (and "response" or "completion") or "messages"'


def _row_example(row, where: str) -> Example:
    """One JSONL row as an Example; a row of the wrong shape names its line."""
    if not isinstance(row, dict):
        raise DFlashError(f"{where} is {json.dumps(row)[:30]}, not {_ROW_KINDS}")

    def text(key, value):
        if not isinstance(value, str):
            raise DFlashError(f"{where}: \"{key}\" is {json.dumps(value)[:30]}, not a string")
        return value

    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise DFlashError(f'{where}: "messages" must be a list of {{"role": ..., "content": ...}} objects')
        for m in msgs:
            text("role", m.get("role"))
            text("content", m.get("content"))
        answer = msgs[-1]["content"] if msgs and msgs[-1]["role"] == "assistant" else ""
        prompt = "\n".join(m["content"] for m in (msgs[:-1] if answer else msgs))
        return Example(prompt, answer, where)
    if "prompt" in row:
        answer = row.get("response") if row.get("response") is not None else row.get("completion")
        return Example(text("prompt", row["prompt"]), "" if answer is None else text("response", answer), where)
    if "text" in row:
        return Example(text("text", row["text"]), source=where)
    raise DFlashError(f"{where} has none of text, prompt or messages: each line must be {_ROW_KINDS}")


def regenerate(examples: list[Example], model, tokenizer, max_tokens: int, batch_size: int = 16) -> list[Example]:
    """Replace each response with the target's own greedy completion of the prompt."""
    from mlx_lm.generate import batch_generate

    out = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        prompts = [tokenizer.encode(e.prompt) for e in chunk]
        res = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens)
        out.extend(Example(e.prompt, text, e.source) for e, text in zip(chunk, res.texts))
    return out


def _pieces(text: str, size: int = 2048):
    """Long texts in ~`size` pieces cut before an unindented line, so encoding
    stays within tokenizer length limits and cuts fall where merges do not span."""
    start = 0
    while len(text) - start > size:
        last = text.rfind("\n", start + 1, start + size)
        cut = last
        while cut > start and text[cut + 1].isspace():
            cut = text.rfind("\n", start + 1, cut)
        if cut <= start:  # no unindented line: any line end, else a hard cut
            cut = last if last > start else start + size - 1
        yield text[start : cut + 1]
        start = cut + 1
    yield text[start:]


@dataclass(frozen=True)
class Packed:
    tokens: np.ndarray  # [n, seq_len] int32
    # [n, seq_len] bool: the tokens the target writes at inference: a response and the EOS after
    # it, or every token of an example without a response (plain text to imitate).
    answers: np.ndarray


def pack_examples(examples: list[Example], tokenizer, seq_len: int, eos_id: Optional[int]) -> Packed:
    """Concatenate examples (EOS-separated), cut into [n, seq_len] rows, and mark their answers."""
    stream: list[int] = []
    answer: list[bool] = []
    for e in examples:
        ids = _encode(e.prompt + e.response, tokenizer)
        asked = _prompt_tokens(e.prompt, ids, tokenizer) if e.response else 0
        stream.extend(ids)
        answer.extend([False] * asked + [True] * (len(ids) - asked))
        if eos_id is not None:
            stream.append(eos_id)
            answer.append(True)
    n = len(stream) // seq_len
    if n == 0:
        raise DFlashError(
            f"the training data has {len(stream)} tokens, fewer than one sequence of {seq_len}: "
            "add data or lower --seq-len"
        )
    return Packed(np.array(stream[: n * seq_len], dtype=np.int32).reshape(n, seq_len),
                  np.array(answer[: n * seq_len], dtype=bool).reshape(n, seq_len))


def _encode(text: str, tokenizer) -> list[int]:
    return [t for piece in _pieces(text) for t in tokenizer.encode(piece, add_special_tokens=False)]


def _prompt_tokens(prompt: str, ids: list[int], tokenizer) -> int:
    """How many of an example's tokens `ids` are its prompt's: those the prompt alone encodes to,
    as far as they agree (a token merged across the boundary counts as the answer's)."""
    n = 0
    for a, b in zip(_encode(prompt, tokenizer), ids):
        if a != b:
            break
        n += 1
    return n


class BatchOrder:
    """Deterministic epoch-shuffled order over sequences; its position is state."""

    def __init__(self, n: int, seed: int, epoch: int = 0, position: int = 0):
        self.n, self.seed, self.epoch, self.position = n, seed, epoch, position
        self._perm = np.random.default_rng([seed, epoch]).permutation(n)

    def next(self, count: int) -> np.ndarray:
        out = []
        while len(out) < count:
            if self.position >= self.n:
                self.epoch += 1
                self.position = 0
                self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            take = min(count - len(out), self.n - self.position)
            out.extend(self._perm[self.position : self.position + take])
            self.position += take
        return np.array(out)

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}
