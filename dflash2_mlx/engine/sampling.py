"""Sampling settings and the target distribution they define.

Speculative and autoregressive decoding must sample from the *same*
distribution, so both use `make_logprobs_transform`: mlx-lm's own filters
(top-p, min-p, top-k, applied in mlx-lm's order) then temperature.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from ..errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    """Request-level sampling settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None

    def __post_init__(self):
        # nan passes every comparison below unnoticed, and inf would flatten the distribution.
        if not math.isfinite(self.temperature):
            raise DFlashError(f"temperature {self.temperature} is not a finite number: use 0 for greedy or a value > 0")
        if self.temperature < 0:
            raise DFlashError(f"temperature {self.temperature} is negative: use 0 for greedy or a value > 0")
        if not 0 < self.top_p <= 1:
            raise DFlashError(f"top_p {self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise DFlashError(f"top_k {self.top_k} must be 0 (off) or positive")
        if not 0 <= self.min_p <= 1:
            raise DFlashError(f"min_p {self.min_p} must be in [0, 1]")
        if self.seed is not None and not 0 <= self.seed < 2**64:  # MLX keys are 64-bit
            raise DFlashError(f"seed {self.seed} must be between 0 and 2**64 - 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def seeded(self) -> bool:
        """Sampling from a seed: what it draws must not depend on the clock or the batch."""
        return self.seed is not None and not self.greedy


def make_logprobs_transform(params: SamplingParams) -> Callable[[mx.array], mx.array]:
    """logits [..., V] -> unnormalised log-probabilities of the target distribution.

    Filtered entries are -inf. Only meaningful for temperature > 0.

    Not under `mx.compile` (mlx-lm's filters compile themselves): compiling this transform or
    the sampler as one graph is bitwise the same but does not pay on the CPU: plain / compiled
    0.86-1.06 in time (median 0.995), 0.95-1.05 in instructions, at vocabularies of 49152 and 151936
    (benchmarks/decode/sampling_compile.py; benchmarks/results/sampling-compile-cpu.json and
    sampling-compile-instructions-cpu.json).
    """
    filters = []
    if 0 < params.top_p < 1:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0:
        filters.append(lambda x: apply_min_p(x, params.min_p))
    if params.top_k > 0:
        filters.append(lambda x: apply_top_k(x, params.top_k) if params.top_k < x.shape[-1] else x)
    inv_temp = 1.0 / params.temperature if params.temperature > 0 else 1.0

    def transform(logits: mx.array) -> mx.array:
        x = logits.astype(mx.float32)
        x = x - mx.logsumexp(x, axis=-1, keepdims=True)
        for f in filters:
            x = f(x)
        return x * inv_temp

    return transform


def token_sampler(params: SamplingParams, transform: Callable[[mx.array], mx.array]):
    """(logits [V], key) -> one token of the target distribution: the argmax
    when greedy, else a draw from `transform(logits)` (built once, so the
    loop never branches on temperature)."""
    if params.greedy:
        return lambda logits, key: greedy_token(logits)
    return lambda logits, key: mx.random.categorical(transform(logits), key=key).astype(mx.int32)


def inverse_cdf(q: np.ndarray, u: float) -> int:
    """The index of a host-side proposal `q` whose CDF interval holds the uniform `u`, never one
    with q = 0: the first index whose CDF passes u has q > 0, and past the end (a CDF short of 1)
    it is the last index with q > 0, as the device walk clamps (selector.walk_sampled)."""
    i = int(np.searchsorted(np.cumsum(q), u, side="right"))
    return min(i, int(np.flatnonzero(q > 0)[-1]))


def greedy_token(logits: mx.array) -> mx.array:
    """The greedy pick; one function so AR and speculative paths tie-break alike."""
    return mx.argmax(logits, axis=-1).astype(mx.int32)


def make_key(sampling: "SamplingParams") -> Optional[mx.array]:
    """A PRNG key from the seed, or from MLX's global generator when unseeded.

    None for greedy decoding, which draws nothing: a key split every step and
    never read would only grow an unevaluated graph, one node per token, and
    add its ops to every step's evaluation.
    """
    if sampling.greedy:
        return None
    seed = sampling.seed
    if seed is None:
        seed = int(mx.random.randint(0, 2**31 - 1, ()).item())
    return mx.random.key(seed)


def split_key(key: Optional[mx.array], num: int = 2) -> tuple:
    """`mx.random.split` into `num` keys; a greedy decode's None key stays None."""
    if key is None:
        return (None,) * num
    return tuple(mx.random.split(key, num))
