"""`dflash2 serve` with one failure a test can ask for (test_serve_robustness.py).

Run as `python tests/faulty_serve.py serve ARGS`. The model and the decode
loops are the real ones; only `GenerationRequest._logits_processors` (the
processors `decode_request` puts in the engine's request) is wrapped: a request whose logit_bias gives token FAULT_TOKEN the bias RAISE
gets one more processor, which raises RuntimeError the first time the decode
loop calls it (a bug inside generation: the request must end alone, with a
500); the bias KILL raises a BaseException there instead, which nothing in
the engine catches (its thread dies: /health must say so and the server exit
non-zero). No other request is touched.
"""

from dflash2_mlx.serve.jobs import GenerationRequest

FAULT_TOKEN, RAISE, KILL = 7, -99.25, -99.75


class EngineKilled(BaseException):
    """What no `except Exception` stops."""


def _raise(tokens, logits):
    raise RuntimeError("injected failure in a logits processor")


def _kill(tokens, logits):
    raise EngineKilled("injected: the engine thread ends here")


_original = GenerationRequest._logits_processors


def _with_faults(self) -> list:
    processors = list(_original(self))
    bias = dict(dict(self.logits).get("logit_bias", ()))
    fault = {RAISE: _raise, KILL: _kill}.get(bias.get(FAULT_TOKEN))
    return processors + [fault] if fault is not None else processors


GenerationRequest._logits_processors = _with_faults

if __name__ == "__main__":
    from dflash2_mlx.cli.entry import main

    main()
