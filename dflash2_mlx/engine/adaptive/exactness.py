"""Where exactness holds: is a verify block bitwise one-by-one decoding on this machine?

Greedy speculative output equals plain decoding token for token only if a target pass
over B rows gives the same logits as the same rows fed one at a time. On MLX's CPU
backend it does, bitwise. On accelerators the two can run different kernels (CUDA's
RoPE for one row or many; Metal's `qmv_wide` for 2 <= M on M3 and later), so the last
bits differ and a near-tie can flip late in a long run. `probe` runs a short prompt's
greedy continuation of B rows (B: the pair's largest block) both ways through the
target, as the decode loop calls it, and `compare_logits` gives the verdict. It is a
fact of the machine and the pair, so it is cached beside the calibration
(calibrate.py), keyed like it plus the MLX version; the caller chooses the folder.
The probe also runs the same verify twice (over the same cache; on CUDA also after a
context past 256 keys, `repeatable`: cuDNN's decode attention there is not
deterministic run to run), and a backend whose same pass gives other logits is
reported so.
"""

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np

from ...errors import DFlashError
from ...files import atomic_write_text
from ...device import backend_name
from ..pair import Pair
from .calibrate import calibration_key

VERSION = 2
BITWISE = "bitwise"
ROUNDING = "equal up to the backend's kernel rounding"
# The probe is about kernels, not context: a short prompt keeps it well under a second.
PROMPT_TOKENS = 64
PLAIN_ROWS = 16  # rows probed for a pair without a drafter (it never runs a block)
# Context of the run-to-run check: past 256 keys, where cuDNN's decode engine stops being
# deterministic (MLX CUDA's scaled_dot_product_attention).
REPEAT_CONTEXT = 320


@dataclass(frozen=True)
class Exactness:
    """A block forward against the same rows one by one: the verdict and how far apart."""

    bitwise: bool
    max_abs_diff: float  # largest |block logit - one-by-one logit|
    rows: int  # rows in the block
    argmax_agreed: int  # rows whose argmax was the same both ways
    key: dict = field(default_factory=dict)  # what the verdict is valid for
    path: Optional[Path] = None  # where it is cached, if anywhere
    cached: bool = False  # read from disk rather than probed now
    deterministic: bool = True  # the same verify twice gave the same logits (`repeatable`)

    @property
    def verdict(self) -> str:
        return BITWISE if self.bitwise else ROUNDING

    def line(self, greedy: bool = True) -> str:
        """One honest line: the verdict, what it means for greedy output, and at T > 0
        that outputs are equal in distribution, not token for token."""
        if self.bitwise:
            head = f"{BITWISE}: a {self.rows}-row verify gives the same logits as one-by-one decoding here"
            tail = "so greedy output equals plain decoding token for token"
        else:
            agreed = (f"argmax agreed on all {self.rows} rows" if self.argmax_agreed == self.rows
                      else f"argmax differed on {self.rows - self.argmax_agreed} of {self.rows} rows")
            head = (f"{ROUNDING}: a {self.rows}-row verify differs from one-by-one decoding by up to "
                    f"{self.max_abs_diff:.2g} in a logit ({agreed})")
            tail = "so greedy output can drift from plain decoding where two tokens nearly tie"
        note = ("" if self.deterministic else "; and this backend is not deterministic: the same verify twice "
                "gave other logits, so two runs of one command can differ")
        if not greedy:
            return f"{head}; at temperature > 0 the output is equal in distribution, not token for token{note}"
        return f"{head}, {tail}{note}"

    def report(self, greedy: bool = True) -> dict:
        """The verdict as a JSON record carries it (`stats.exactness`, compare, doctor)."""
        return {"verdict": self.verdict, "max_abs_diff": self.max_abs_diff, "rows": self.rows,
                "argmax_agreed": self.argmax_agreed, "deterministic": self.deterministic, "cached": self.cached,
                "path": str(self.path) if self.path else None, "message": self.line(greedy)}

    def to_dict(self) -> dict:
        return {"version": VERSION, "key": self.key, "verdict": self.verdict, "max_abs_diff": self.max_abs_diff,
                "rows": self.rows, "argmax_agreed": self.argmax_agreed, "deterministic": self.deterministic}


def compare_logits(block, steps) -> Exactness:
    """The verdict for logits [R, V] of one block forward against the same rows one by
    one (numpy arrays of one dtype): bitwise only when every bit is the same."""
    a, b = np.asarray(block), np.asarray(steps)
    if a.shape != b.shape or a.dtype != b.dtype or a.ndim != 2:
        raise ValueError(f"logits to compare must be [rows, vocab] of one dtype: {a.shape} {a.dtype} "
                         f"against {b.shape} {b.dtype}")
    bitwise = np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    agreed = int(np.sum(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
    return Exactness(bitwise, float(diff.max()) if diff.size else 0.0, a.shape[0], agreed)


def probe(pair: Pair, prompt_ids: Sequence[int], rows: Optional[int] = None) -> Exactness:
    """Read the prompt (its first PROMPT_TOKENS), decode `rows` greedy tokens one by one
    (plain steps), then run the same rows as one block after the same prompt (a verify
    that accepts everything); compare the logits. `rows` None: the pair's largest block."""
    target = pair.target
    rows = rows or (pair.max_block_size if pair.drafter is not None else PLAIN_ROWS)
    prompt = mx.array([list(prompt_ids)[:PROMPT_TOKENS]], dtype=mx.int32)
    if prompt.size == 0:
        raise ValueError("the exactness probe needs a prompt of at least one token")
    one, block = target.make_cache(), target.make_cache()
    logits, _ = target(prompt, one, (), last_logits_only=True)
    target(prompt, block, (), last_logits_only=True)
    token, tokens, stepped = int(mx.argmax(logits[0, -1]).item()), [], []
    for _ in range(rows):  # as PlainStep runs a row
        tokens.append(token)
        logits, _, _ = target.forward_undoable(mx.array([[token]], dtype=mx.int32), one, pair.layer_ids)
        stepped.append(logits[0, -1])
        token = int(mx.argmax(logits[0, -1]).item())
    logits, _, undo = target.forward_undoable(mx.array([tokens], dtype=mx.int32), block, pair.layer_ids)  # a verify
    # float32 holds every bf16 / fp16 value exactly, so bits equal there are bits equal here.
    block_logits = np.array(logits[0].astype(mx.float32))
    found = compare_logits(block_logits, np.array(mx.stack(stepped).astype(mx.float32)))
    # Run to run: the same verify again over the same cache (free), and on CUDA again past 256
    # keys, where cuDNN's decode attention is the known source (a long prefill, seconds on a CPU).
    target.rollback(block, undo, 0)
    again, _, _ = target.forward_undoable(mx.array([tokens], dtype=mx.int32), block, pair.layer_ids)
    same = np.array(again[0].astype(mx.float32)).tobytes() == block_logits.tobytes()
    if same and backend_name() == "cuda":
        same = repeatable(pair, prompt_ids, rows)
    return replace(found, deterministic=same)


def repeatable(pair: Pair, prompt_ids: Sequence[int], rows: int, context: int = REPEAT_CONTEXT) -> bool:
    """Whether the same verify of `rows` rows after `context` tokens (the prompt repeated)
    gives bitwise the same logits twice (the second after the first is undone, over the
    same cache: the same kernels on the same inputs)."""
    target, ids = pair.target, list(prompt_ids)
    ids = (ids * (context // max(len(ids), 1) + 1))[: context + rows]
    cache, outs = target.make_cache(), []
    mx.eval(target(mx.array([ids[:context]], dtype=mx.int32), cache, (), last_logits_only=True)[0])
    for _ in range(2):
        logits, _, undo = target.forward_undoable(mx.array([ids[context:]], dtype=mx.int32), cache, pair.layer_ids)
        outs.append(np.array(logits[0].astype(mx.float32)).tobytes())
        target.rollback(cache, undo, 0)
    return outs[0] == outs[1]


def exactness_key(pair: Pair, rows: int) -> dict:
    """What the verdict depends on: the calibration's key, the MLX version, the block probed."""
    return {**calibration_key(pair), "version": VERSION, "mlx": mx.__version__, "rows": rows}


def exactness_path(pair: Pair, folder: Path, rows: Optional[int] = None) -> Path:
    """The file under `folder` that holds this pair's verdict on this machine."""
    rows = rows or (pair.max_block_size if pair.drafter is not None else PLAIN_ROWS)
    name = hashlib.sha1(json.dumps(exactness_key(pair, rows), sort_keys=True).encode()).hexdigest()[:20]
    return Path(folder).expanduser() / f"exactness-{name}.json"


def load_or_probe(pair: Pair, folder: Optional[Path], prompt_ids: Sequence[int], again: bool = False) -> Exactness:
    """The cached verdict for this pair on this machine, probed (and saved under
    `folder`, when given) if there is none or `again`."""
    rows = pair.max_block_size if pair.drafter is not None else PLAIN_ROWS
    key = exactness_key(pair, rows)
    path = exactness_path(pair, folder, rows) if folder is not None else None
    if path is not None and not again:
        found = _read(path, key)
        if found is not None:
            return found
    found = probe(pair, prompt_ids, rows)
    if path is not None:
        try:
            atomic_write_text(path, json.dumps({**found.to_dict(), "key": key}, indent=1) + "\n")
        except DFlashError:  # a cache that cannot be written only costs a probe next time
            path = None
    return replace(found, key=key, path=path)


def _read(path: Path, key: dict) -> Optional[Exactness]:
    """A cached verdict, or None when missing, unreadable or for another key."""
    try:
        record = json.loads(path.read_text())
        if record.get("key") != key:
            return None
        return Exactness(record["verdict"] == BITWISE, float(record["max_abs_diff"]), int(record["rows"]),
                         int(record["argmax_agreed"]), key, path, cached=True,
                         deterministic=bool(record["deterministic"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
