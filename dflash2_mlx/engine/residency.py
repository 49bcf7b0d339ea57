"""Where generation runs and what stays in memory while it does: mlx-lm's two habits.

`generation_stream` is a stream of its own on the default device for the
engine's work, as mlx-lm's `generate.py` keeps one. It is thread-local, as
mlx-lm's is (`mx.new_thread_local_stream`): MLX streams belong to the thread
that made them, and the server decodes on a worker thread, not on the thread
that imported this module.

`wired_limit(models, streams)` is mlx-lm's `wired_limit` for a pair: on a Mac
(a device that reports `max_recommended_working_set_size`) it raises MLX's wired
limit to that size for the duration, so a large model's weights stay resident
instead of being paged out between passes; it warns when the models are close
to that size, and on exit synchronizes the streams (the limit must not change
under an async eval) and restores the previous limit. Elsewhere (the CPU and
CUDA builds report no such size) it does nothing.
"""

import contextlib
import warnings
from typing import Iterable, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_reduce

# A stream on the default device just for generation (per thread), as mlx-lm's.
generation_stream = mx.new_thread_local_stream(mx.default_device())

# mlx-lm warns when the model takes more than this share of the recommended working set.
CLOSE_TO_LIMIT = 0.9


def modules_of(models) -> list:
    """The nn.Modules behind `models`: a Pair (its target's model and its drafter,
    when it has one), a Target (its model), one nn.Module, or an iterable of these."""
    if isinstance(models, nn.Module):
        return [models]
    if hasattr(models, "target"):  # a Pair: the drafter borrows the target's embedding and head
        return modules_of(models.target) + ([models.drafter] if getattr(models, "drafter", None) is not None else [])
    if hasattr(models, "model"):  # a Target
        return [models.model]
    out, seen = [], set()
    for m in models:
        for module in modules_of(m):
            if id(module) not in seen:
                seen.add(id(module))
                out.append(module)
    return out


def model_bytes(models) -> int:
    """Bytes of every array in `models` (as mlx-lm counts a model for its warning)."""
    return sum(tree_reduce(lambda acc, x: acc + x.nbytes if isinstance(x, mx.array) else acc, m, 0)
               for m in modules_of(models))


@contextlib.contextmanager
def wired_limit(models: Union[nn.Module, Iterable, object],
                streams: Optional[list] = None):
    """Wire the recommended working set while generating with `models` (see the module's docstring).

    Pass the streams an async eval may still be running on (mlx-lm passes
    `[generation_stream]`); without them every stream is synchronized on exit.
    """
    max_rec_size = mx.device_info().get("max_recommended_working_set_size")
    if max_rec_size is None:  # no Metal: nothing to wire, nothing to restore
        yield
        return
    old_limit = mx.set_wired_limit(max_rec_size)
    try:
        size = model_bytes(models)
        if size > CLOSE_TO_LIMIT * max_rec_size:
            warnings.warn(f"generating with models that need {size // 2**20} MB, close to the maximum recommended "
                          f"size of {max_rec_size // 2**20} MB: this can be slow (see mlx-lm's notes on large "
                          "models: https://github.com/ml-explore/mlx-lm/tree/main#large-models)", stacklevel=3)
        yield
    finally:
        if streams is not None:
            for s in streams:
                mx.synchronize(s)
        else:
            mx.synchronize()
        mx.set_wired_limit(old_limit)
