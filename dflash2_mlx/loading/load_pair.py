"""Load a target and its drafter into one checked `Pair`."""

import warnings
from typing import Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from ..engine.drafter.context_caches import check_draft_window
from ..engine.pair import Pair
from ..errors import DFlashError
from .builtin import resolve_builtin
from .checkpoints import load_drafter, load_target
from .hub import check_reference
from .quantize import DraftQuant, is_quantized, quantize_drafter


def load_pair(
    target_ref: str,
    drafter_ref: Optional[str] = None,
    draft_quant: Optional[str] = None,
    activation_dtype: Optional[mx.Dtype] = None,
    tokenizer_config: Optional[dict] = None,
    group: Optional[mx.distributed.Group] = None,
    time_collectives: bool = True,
    draft_window: Optional[int] = None,
) -> tuple[Pair, object]:
    """Load target (+ drafter), check they fit, quantize the drafter if asked.

    Returns (Pair, tokenizer); the pair has no drafter when `drafter_ref` is
    None. Both references are checked first, the target's before the
    drafter's (a wrong target is reported as such); then the drafter is
    loaded first: its config is cheap to check. With a
    distributed `group` the target is split over its ranks and the drafter
    loaded whole on each (see `load_target`). `draft_window` N bounds the
    drafter's full-attention context to its first rows and the latest N
    (`Drafter.set_context_window`; None: the checkpoint's own attention).
    """
    # The values first (no file is read), then the references, the target's first.
    check_draft_window(draft_window)
    quant = DraftQuant.parse(draft_quant) if draft_quant else None
    check_reference(resolve_builtin(target_ref, "target"), "target")
    if drafter_ref:
        check_reference(resolve_builtin(drafter_ref, "drafter"), "drafter")
    drafter = None
    if drafter_ref:
        drafter = load_drafter(resolve_builtin(drafter_ref, "drafter"), activation_dtype=activation_dtype)
        drafter.set_context_window(draft_window)
        if quant and is_quantized(drafter):  # quantizing packed weights again would be silently skipped
            raise DFlashError(f"drafter '{drafter_ref}' is already quantized: drop --draft-quant, or quantize "
                              "the original (unquantized) drafter instead")
        if activation_dtype is None and _runs_in_fp16(drafter):  # `--draft-quant w4a16`'s pitfall, in a saved copy
            warnings.warn(f"drafter '{drafter_ref}' was saved with fp16 activations, which overflow DFlash residuals "
                          "and can zero acceptance on M1/M2: quantize the original again with a32 or abf16")
    target, tokenizer = load_target(
        resolve_builtin(target_ref, "target"), activation_dtype=activation_dtype,
        tokenizer_config=tokenizer_config, group=group, time_collectives=time_collectives,
    )
    pair = Pair.make(target, drafter)
    if drafter is not None and quant:
        if quant.fp16_activations:
            warnings.warn(
                f"draft quantization {quant} uses fp16 activations, which overflow DFlash "
                "residuals and can zero acceptance on M1/M2: prefer a32 or abf16"
            )
        quantize_drafter(drafter, quant)
    return pair, tokenizer


def _runs_in_fp16(drafter) -> bool:
    return any(v.dtype == mx.float16 for _, v in tree_flatten(drafter.parameters()))

