"""Stopping without dropping anyone: the drain, and when to retry.

On SIGTERM (or Ctrl-C) the server keeps its listening socket open: the
requests it already holds run to their end, and every new one is answered at
once with 503 and its protocol's error object (a client sees an answer it can
act on, not "connection refused"). The HTTP server (cli/serve.py) stops once
`idle`. uvicorn's own shutdown cannot do this: it closes the socket first.
"""

import math


class Drain:
    """Whether the server takes new requests, and how many it holds."""

    def __init__(self):
        self.draining = False
        self.held = 0  # requests admitted and not yet answered in full (streams included)

    def start(self) -> None:
        self.draining = True

    @property
    def idle(self) -> bool:
        return self.held == 0


def retry_after_s(mean_generation_s, longest_s: int = 60) -> int:
    """Seconds a client refused for a full queue should wait (the Retry-After
    header): one slot frees when the running generation ends, which takes at
    most about one generation; 1 until a generation has been timed."""
    if not mean_generation_s or mean_generation_s <= 0:
        return 1
    return max(1, min(longest_s, math.ceil(mean_generation_s)))
