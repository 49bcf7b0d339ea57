"""One decode request: every setting a generation runs with, checked once.

The command line, the server, compare, bench, analyze, chat and the batch
runner all build a `DecodeRequest`; its construction is the only place a
setting's own rule is checked (a `RequestError` naming the field). What
depends on the loaded pair (a block the drafter can draft, a tree its
lattice can fill, the room left in the context) is checked once more, by
`engine.plan.plan`, which turns the request into the plan both decode loops
run. The defaults are the command line's.
"""

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional, Union

from ..errors import DFlashError
from .grammar import Grammar
from .sampling import SamplingParams

# Below this a temperature decodes greedily, as vLLM reads it: 1/T past float32's
# range would make every row NaN.
GREEDY_BELOW = 1e-5


class RequestError(DFlashError):
    """A setting broke its rule; `field` names it (the CLI shows its flag, the server the body field)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class DecodeRequest:
    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    # "auto": each cycle's block from the measured costs (docs/adaptive.md); an int: a
    # fixed block, anchor included (2..the drafter's block_size); None: the drafter's own.
    block_size: Union[int, str, None] = "auto"
    tree_rows: int = 0  # > 0: verify trees of this many rows (docs/tree.md); 0: the chain
    grammar: Optional[Grammar] = None  # structured output, exact inside speculation
    logits_processors: tuple[Callable, ...] = ()  # mlx-lm's make_logits_processors (bias, penalties)
    top_logprobs: Optional[int] = None  # k: each token's log-probability and the k most likely
    stop: tuple[str, ...] = ()  # stop strings (the text layer's)
    prefill_step_size: Optional[int] = None  # None: the backend's (device.default_prefill_step_size)

    def __post_init__(self):
        _set(self, "max_tokens", _count("max_tokens", self.max_tokens, 1))
        if not isinstance(self.sampling, SamplingParams):
            raise RequestError("sampling", f"sampling {self.sampling!r}: pass a SamplingParams")
        if 0 < self.sampling.temperature < GREEDY_BELOW:
            _set(self, "sampling", replace(self.sampling, temperature=0.0))
        _set(self, "block_size", _block_size(self.block_size))
        _set(self, "tree_rows", tree_rows_value(self.tree_rows))
        if self.top_logprobs is not None:
            _set(self, "top_logprobs", _count("top_logprobs", self.top_logprobs, 0))
        if self.prefill_step_size is not None:
            _set(self, "prefill_step_size", _count("prefill_step_size", self.prefill_step_size, 1))
        if isinstance(self.stop, str):
            _set(self, "stop", (self.stop,))
        _set(self, "stop", tuple(self.stop))
        if not all(isinstance(s, str) for s in self.stop):
            raise RequestError("stop", f"stop {self.stop!r}: give strings")
        _set(self, "logits_processors", tuple(self.logits_processors))

    @property
    def auto(self) -> bool:
        return self.block_size == "auto"

    def replace(self, **changes) -> "DecodeRequest":
        """A copy with `changes`, checked as a new request is."""
        return replace(self, **changes)


def tree_rows_value(rows) -> int:
    """The tree rule that does not need the pair: 0 (the chain) or at least 2 rows
    (the anchor and one draft). How many the drafter's lattice holds is the plan's check."""
    rows = _count("tree_rows", rows, 0)
    if rows == 1:
        raise RequestError("tree_rows", "tree_rows 1: use 0 for the chain or N >= 2 rows per verify pass "
                                        "(e.g. 8 or 16)")
    return rows


def _block_size(value):
    """"auto", None or a whole number (text as the command line gives it is read here)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit():
            return int(text)
        raise RequestError("block_size", f"block_size '{value}' must be 'auto' or a whole number of tokens, e.g. 4")
    return _count("block_size", value, 1)


def _count(field: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        else:
            raise RequestError(field, f"{field} {value!r} must be a whole number")
    if value < least:
        raise RequestError(field, f"{field} {value} must be at least {least}")
    return value


def _set(request: DecodeRequest, field: str, value) -> None:
    object.__setattr__(request, field, value)  # frozen: normalised once, while being built
