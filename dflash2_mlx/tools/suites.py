"""Built-in benchmark prompts: a few short prompts of each kind.

Acceptance depends on the kind of text (code and maths are more predictable
than chat), so benchmarks report each suite, never one best case.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import DFlashError
from ..text.prompt import PROBE_TEXT

SUITES: dict[str, tuple[str, ...]] = {
    "code": (
        PROBE_TEXT,
        "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
        "Write a Python class for a stack with push, pop, peek and is_empty methods.",
    ),
    "chat": (
        "What are three good habits for staying focused while working from home?",
        "Explain to a ten-year-old why the sky is blue.",
        "Suggest a simple plan for a relaxing weekend in a small town.",
    ),
    "maths": (
        "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain step by step.",
        "Solve for x: 4x + 6 = 30. Show your working.",
        "A train travels 120 km in 1.5 hours. What is its average speed in km/h? Explain.",
    ),
}


@dataclass(frozen=True)
class BenchPrompt:
    suite: str
    index: int  # position within its suite
    text: str


def builtin_prompts(suites: list[str], limit: int = 0) -> list[BenchPrompt]:
    """Prompts of the named suites (`limit` > 0 keeps that many per suite)."""
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise DFlashError(f"unknown suite '{unknown[0]}': choose from {', '.join(SUITES)}")
    out = []
    for suite in suites:
        texts = SUITES[suite][:limit] if limit > 0 else SUITES[suite]
        out += [BenchPrompt(suite, i, t) for i, t in enumerate(texts)]
    return out


def read_prompts(path: Path, limit: int = 0) -> list[BenchPrompt]:
    """Prompts from a file: JSONL objects with "prompt" (and optionally
    "suite"), or plain text with one prompt per non-empty line."""
    path = Path(path)
    if not path.is_file():
        raise DFlashError(f"prompts file '{path}' does not exist")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out: list[BenchPrompt] = []
    counts: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        suite, text = path.stem, line
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DFlashError(f"prompts file '{path}' line {n} is not JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise DFlashError(f"prompts file '{path}' line {n} needs a \"prompt\" string")
            suite, text = str(obj.get("suite", suite)), obj["prompt"]
        index = counts.get(suite, 0)
        if limit <= 0 or index < limit:
            out.append(BenchPrompt(suite, index, text))
        counts[suite] = index + 1
    if not out:
        raise DFlashError(f"prompts file '{path}' has no prompts")
    return out
