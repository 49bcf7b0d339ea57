"""An honest side-by-side: plain decoding against DFlash / DFlash 2.

Both arms read the same prompt token ids with the same seed and settings; both
are warmed up; they run one after the other, never at the same time (they
would share memory bandwidth and compute), alternating which goes first over
the repeats. Every token's time is recorded, so the runs can be replayed
together on one timeline afterwards. No UI here.
"""

import platform
import statistics
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import mlx.core as mx

from ..engine.adaptive.exactness import Exactness
from ..engine.pair import Pair
from ..text.generate import stream_generate
from ..device import backend_name
from ..engine.request import DecodeRequest
from ..text.stats import GenerationStats

WARMUP_TOKENS = 24


@dataclass(frozen=True)
class ArmRun:
    """One measured generation."""

    mode: str  # "ar", "dflash" or "dflash2"
    tokens: list[int]
    pieces: list[str]  # the text each token added
    from_draft: list[bool]
    times: list[float]  # seconds from the call to each token (the first includes prefill)
    stats: GenerationStats

    @property
    def prompt_seconds(self) -> float:
        return self.times[0]

    @property
    def total_seconds(self) -> float:
        return self.times[-1]

    @property
    def decode_tps(self) -> float:
        """Tokens after the first / time after the first (after prefill)."""
        span = self.times[-1] - self.times[0]
        return (len(self.tokens) - 1) / span if len(self.tokens) > 1 and span > 0 else 0.0

    @property
    def e2e_tps(self) -> float:
        return len(self.tokens) / self.times[-1] if self.times[-1] > 0 else 0.0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode, "text": self.text, "token_ids": self.tokens, "from_draft": self.from_draft,
            "pieces": self.pieces, "times_s": self.times, "prompt_s": self.prompt_seconds,
            "total_s": self.total_seconds, "decode_tps": self.decode_tps, "e2e_tps": self.e2e_tps,
            "stats": self.stats.to_dict(),
        }


@dataclass(frozen=True)
class Parity:
    verdict: str  # "identical", "diverged" or "distribution" (T > 0)
    index: Optional[int] = None  # first differing token
    ar_token: Optional[int] = None
    spec_token: Optional[int] = None
    ar_text: Optional[str] = None
    spec_text: Optional[str] = None

    @property
    def message(self) -> str:
        if self.verdict == "identical":
            return "identical: DFlash output equals plain greedy decoding token for token"
        if self.verdict == "distribution":
            return ("sampling (T > 0): outputs match in distribution, not token for token; "
                    "the texts differ by design")
        if self.ar_token is None or self.spec_token is None:
            return f"diverged at token {self.index}: one output stops there and the other goes on"
        return (f"diverged at token {self.index}: plain decoding gave {self.ar_token} {self.ar_text!r}, "
                f"DFlash gave {self.spec_token} {self.spec_text!r}")


def first_divergence(plain: Sequence[int], spec: Sequence[int]) -> Optional[int]:
    """The first index where two token lists differ (one stopping while the other
    goes on counts, at its length); None when they are equal."""
    for i, (a, b) in enumerate(zip(plain, spec)):
        if a != b:
            return i
    return None if len(plain) == len(spec) else min(len(plain), len(spec))


def parity(ar: ArmRun, spec: ArmRun, greedy: bool) -> Parity:
    """Greedy speculative decoding must equal greedy plain decoding."""
    if not greedy:
        return Parity("distribution")
    i = first_divergence(ar.tokens, spec.tokens)
    if i is None:
        return Parity("identical")

    def at(run):  # None past the end of a run that stopped (EOS) where the other went on
        return (run.tokens[i], run.pieces[i]) if len(run.tokens) > i else (None, None)

    (a, a_text), (b, b_text) = at(ar), at(spec)
    return Parity("diverged", i, a, b, a_text, b_text)


def run_arm(pair: Pair, tokenizer, prompt_ids: Sequence[int], request: DecodeRequest, calibration=None) -> ArmRun:
    """Generate once, timing every token from the call."""
    tokens, pieces, flags, times, last = [], [], [], [], None
    tic = time.perf_counter()
    for r in stream_generate(pair, tokenizer, list(prompt_ids), request, calibration=calibration):
        times.append(time.perf_counter() - tic)
        tokens.append(r.token)
        pieces.append(r.text)
        flags.append(r.from_draft)
        last = r
    return ArmRun(last.stats.mode, tokens, pieces, flags, times, last.stats)


@dataclass(frozen=True)
class Comparison:
    prompt_ids: list[int]
    settings: dict
    ar: list[ArmRun]  # one per repeat
    spec: list[ArmRun]
    order: list[list[str]]  # which arm ran first in each repeat
    machine: dict
    parity: Parity
    exactness: Optional[Exactness] = None  # whether a verify block is bitwise one-by-one decoding here

    @property
    def exactness_line(self) -> Optional[str]:
        """The exactness verdict in one line (None when it was not probed)."""
        if self.exactness is None:
            return None
        return self.exactness.line(greedy=self.parity.verdict != "distribution")

    @property
    def spec_mode(self) -> str:
        return self.spec[0].mode

    def summary(self) -> dict:
        """Medians over repeats; speedups are of the medians."""

        def med(runs, attr):
            return statistics.median(getattr(r, attr) for r in runs)

        ar_decode, spec_decode = med(self.ar, "decode_tps"), med(self.spec, "decode_tps")
        ar_e2e, spec_e2e = med(self.ar, "e2e_tps"), med(self.spec, "e2e_tps")
        s = self.spec[0].stats
        return {
            "repeats": len(self.ar),
            "ar": _arm_summary(self.ar),
            "spec": _arm_summary(self.spec),
            "speedup_decode": spec_decode / ar_decode if ar_decode else 0.0,
            "speedup_e2e": spec_e2e / ar_e2e if ar_e2e else 0.0,
            "mean_acceptance_length": statistics.mean(r.stats.mean_acceptance_length for r in self.spec),
            "acceptance_by_position": _mean_lists([r.stats.acceptance_by_position for r in self.spec]),
            "acceptance_rate": statistics.mean(r.stats.acceptance_rate for r in self.spec),
            "block_size": s.block_size,
            "tree_rows": s.tree_rows,
            "block_policy": s.block_policy,
            "block_sizes": s.block_sizes,  # the last spec run's (auto: 1 = plain steps)
            "plain_share": statistics.mean(r.stats.plain_share or 0.0 for r in self.spec),
            "fallback": s.fallback,
            "spec_mode": s.mode,
        }

    def to_dict(self) -> dict:
        return {
            "kind": "dflash2-compare",
            "prompt_token_ids": self.prompt_ids,
            "settings": self.settings,
            "machine": self.machine,
            "order": self.order,
            "runs": {"ar": [r.to_dict() for r in self.ar], self.spec_mode: [r.to_dict() for r in self.spec]},
            "summary": self.summary(),
            "parity": {**asdict(self.parity), "message": self.parity.message},
            "exactness": (self.exactness.report(self.parity.verdict != "distribution")
                          if self.exactness is not None else None),
        }


def _arm_summary(runs: list[ArmRun]) -> dict:
    def med(attr):
        return statistics.median(getattr(r, attr) for r in runs)

    return {
        "mode": runs[0].mode,
        "tokens": runs[0].stats.generation_tokens,
        "decode_tps": med("decode_tps"),
        "e2e_tps": med("e2e_tps"),
        "prompt_tps": statistics.median(r.stats.prompt_tps for r in runs),
        "prompt_s": med("prompt_seconds"),
        "total_s": med("total_seconds"),
        "target_passes": runs[0].stats.target_passes,
        "peak_memory_gb": max(r.stats.peak_memory_gb for r in runs),
    }


def _mean_lists(lists: list[list[float]]) -> list[float]:
    return [statistics.mean(col) for col in zip(*lists)] if lists and lists[0] else []


def machine_info() -> dict:
    import importlib.metadata as md

    info = {"backend": backend_name(), "device": platform.machine(), "platform": platform.platform(),
            "mlx_version": mx.__version__}
    try:
        info["mlx_lm_version"] = md.version("mlx-lm")
    except md.PackageNotFoundError:
        pass
    try:
        info["device_name"] = mx.device_info().get("device_name", "")
    except Exception:  # older MLX: no device_info
        pass
    return info


def compare(
    pair: Pair, tokenizer, prompt_ids: Sequence[int], request: DecodeRequest = DecodeRequest(max_tokens=128), *,
    calibration=None, repeats: int = 2, warmup_tokens: int = WARMUP_TOKENS,
    on_arm: Optional[Callable[[str, str, int], None]] = None, exactness: Optional[Exactness] = None,
) -> Comparison:
    """Warm both arms up, then run them one after the other `repeats` times,
    alternating which goes first. `on_arm(phase, mode, repeat)` is called
    before each run (phase "warmup" or "measure"), never during one.
    `exactness` (adaptive/exactness.py) says whether parity is bitwise or up to
    the backend's kernel rounding; it goes into the record beside the parity."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    prompt_ids = list(prompt_ids)
    arms = {"ar": pair.without_drafter(), "spec": pair}
    warmup = request.replace(max_tokens=min(request.max_tokens, warmup_tokens))
    for name, arm in arms.items():
        if on_arm:
            on_arm("warmup", name, 0)
        run_arm(arm, tokenizer, prompt_ids, warmup, calibration)
    runs: dict[str, list[ArmRun]] = {"ar": [], "spec": []}
    order = []
    for i in range(repeats):
        names = ["ar", "spec"] if i % 2 == 0 else ["spec", "ar"]
        for name in names:
            if on_arm:
                on_arm("measure", name, i)
            arm = arms[name]
            runs[name].append(run_arm(arm, tokenizer, prompt_ids, request, calibration))
        order.append([runs[n][-1].mode for n in names])
    sampling = request.sampling
    verdict = Parity("identical")
    for a, s in zip(runs["ar"], runs["spec"]):
        verdict = parity(a, s, sampling.greedy)
        if verdict.verdict != "identical":
            break
    settings = {
        "max_tokens": request.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "top_k": sampling.top_k, "min_p": sampling.min_p, "seed": sampling.seed,
        "block_size": runs["spec"][0].stats.block_size, "block_policy": runs["spec"][0].stats.block_policy,
        "tree_rows": request.tree_rows, "repeats": repeats, "warmup_tokens": warmup_tokens,
    }
    return Comparison(prompt_ids, settings, runs["ar"], runs["spec"], order, machine_info(), verdict, exactness)


def honest_lines(summary: dict, machine: dict) -> list[str]:
    """What the numbers mean when drafting loses or auto gave up on it, in plain words
    (`dflash2 compare` prints them under its table; the page shows them under the race)."""
    lines = []
    speed = summary["speedup_decode"]
    if 0 < speed < 1:
        tau = summary["mean_acceptance_length"]
        why = (f"slower here: each cycle committed τ = {tau:.2f} tokens but took about {tau / speed:.1f}x a plain "
               "decoding step (drafting plus a block verify); speculation pays only when τ exceeds that cost.")
        if machine.get("backend") == "cpu":
            why += (" On the Linux CPU build a block verify of a real-size model costs nearly as much per row as "
                    "plain decoding, so it cannot win there; τ and target passes carry over to GPUs, tokens/s do not.")
        lines.append(why)
    if summary.get("block_policy") == "auto" and summary.get("fallback"):
        lines.append(f"auto fell back to plain decoding {summary['fallback']}")
    return lines


def race(pair: Pair, tokenizer, prompt_ids: Sequence[int], request: DecodeRequest, calibration=None) -> dict:
    """One race as the page shows it: both arms warmed up, then plain decoding and then
    the pair, once each; the JSON record of `compare` (per-token times of both arms)
    with its honest lines under `notes`."""
    result = compare(pair, tokenizer, prompt_ids, request, calibration=calibration, repeats=1)
    record = result.to_dict()
    record["notes"] = honest_lines(record["summary"], record["machine"])
    return record


@dataclass(frozen=True)
class ReplayFrame:
    """What the replay shows at time `t`: tokens visible in each arm."""

    t: float
    ar_shown: int
    spec_shown: int
    ar_done: bool
    spec_done: bool


def replay_frame(ar: ArmRun, spec: ArmRun, t: float) -> ReplayFrame:
    a, s = bisect_right(ar.times, t), bisect_right(spec.times, t)
    return ReplayFrame(t, a, s, a == len(ar.tokens), s == len(spec.tokens))


def replay_duration(ar: ArmRun, spec: ArmRun) -> float:
    return max(ar.total_seconds, spec.total_seconds)
