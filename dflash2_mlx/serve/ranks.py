"""Serving with the target split over MLX distributed ranks (`serve --processes N`).

Only rank 0 listens for HTTP; every target pass is a collective, so the other
ranks (followers) must run exactly the same generations, in the same order,
with the same arguments. Rank 0's engine worker sends each request to them
before running it (`JobChannel.send`: a length, then JSON bytes, each one
all_sum to which the followers add zeros) and, at every yielded token, whether
to go on (`agree`: a client that left ends the answer at the same step on every
rank). Stop strings and the end of an answer follow from the same tokens on
every rank. `None` sent is the stop job: the followers return.
"""

import json
import secrets
from dataclasses import asdict
from typing import Optional

import mlx.core as mx

from ..engine.sampling import SamplingParams
from .jobs import GenerationRequest


class JobChannel:
    def __init__(self, group):
        self.group = group
        self.leader = group.rank() == 0

    def _sum(self, values: mx.array) -> mx.array:
        out = mx.distributed.all_sum(values, group=self.group)
        mx.eval(out)
        return out

    def _bytes(self, payload: Optional[bytes]) -> bytes:
        n = self._sum(mx.array([len(payload) if self.leader else 0], dtype=mx.int32)).item()
        if n == 0:
            return b""
        data = mx.array(list(payload) if self.leader else [0] * n, dtype=mx.int32)
        return bytes(self._sum(data).tolist())

    def send(self, request: Optional[GenerationRequest]) -> Optional[GenerationRequest]:
        """Rank 0: hand `request` (None: stop) to every rank; returns it as the
        followers will run it (an unseeded sampled request gets a seed here, or
        each rank would draw its own)."""
        if request is not None and request.sampling.seed is None and not request.sampling.greedy:
            request = GenerationRequest(request.prompt_ids, request.max_tokens,
                                        SamplingParams(**{**asdict(request.sampling), "seed": secrets.randbits(63)}),
                                        request.stop)
        body = b"null" if request is None else json.dumps({
            "prompt_ids": list(request.prompt_ids), "max_tokens": request.max_tokens,
            "sampling": asdict(request.sampling), "stop": list(request.stop)}).encode()
        self._bytes(body)
        return request

    def receive(self) -> Optional[GenerationRequest]:
        """A follower: the next request rank 0 runs, or None to stop."""
        spec = json.loads(self._bytes(None))
        if spec is None:
            return None
        return GenerationRequest(tuple(spec["prompt_ids"]), spec["max_tokens"], SamplingParams(**spec["sampling"]),
                                 tuple(spec["stop"]))

    def agree(self, go: bool) -> bool:
        """Rank 0's decision to take the next token, on every rank."""
        return self._sum(mx.array([int(go) if self.leader else 0], dtype=mx.int32)).item() > 0
