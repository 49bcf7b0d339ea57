"""Does this drafter fit this target? Checked before any generation.

Each failure names the mismatched pair and what would fit, because a drafter
trained for another target otherwise runs silently at ~0 % acceptance.
"""

import math
from dataclasses import dataclass
from typing import Optional

from .drafter import Drafter
from .errors import IncompatibleError
from .target import Target


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str


def compatibility_report(drafter: Drafter, target: Target) -> list[Check]:
    """All checks, passing or not (for `doctor`)."""
    c = drafter.config
    Ht, n_layers = target.hidden_size, target.num_layers
    ids = c.resolve_layer_ids(n_layers)
    fc_in = drafter.fc.weight.shape[1]
    if hasattr(drafter.fc, "bits"):
        fc_in = fc_in * 32 // drafter.fc.bits
    checks = [
        Check("hidden_size", c.hidden_size == Ht,
              f"drafter hidden_size {c.hidden_size} vs target hidden_size {Ht}"
              + ("" if c.hidden_size == Ht else ": this drafter was trained for a different target")),
        Check("fc_width", fc_in == len(ids) * Ht,
              f"drafter fc input width {fc_in} vs {len(ids)} target layers × hidden {Ht} = {len(ids) * Ht}"),
        Check("target_layer_ids", all(0 <= i < n_layers for i in ids),
              f"drafter target_layer_ids {ids} vs target with {n_layers} layers (ids must be < {n_layers})"),
        Check("mask_token_id", c.mask_token_id is not None and 0 <= c.mask_token_id < target.embedding_rows,
              f"drafter mask_token_id {c.mask_token_id} vs target embedding rows {target.embedding_rows}"
              f" (must be < {target.embedding_rows})"),
    ]
    if c.num_target_layers is not None:
        checks.append(Check("num_target_layers", c.num_target_layers == n_layers,
                            f"drafter num_target_layers {c.num_target_layers} vs target layers {n_layers}"))
    if drafter.is_dflash2:
        rows = drafter.candidate_selector.successor_codebook.weight.shape[0]
        checks.append(Check("vocab", rows == target.vocab_size,
                            f"drafter selector codebooks have {rows} rows vs target vocabulary {target.vocab_size}"))
    else:
        checks.append(Check("vocab", c.vocab_size == target.vocab_size,
                            f"drafter vocab_size {c.vocab_size} vs target vocabulary {target.vocab_size}"))
    if c.selector_top_k >= target.vocab_size and drafter.is_dflash2:
        checks.append(Check("selector_top_k", False,
                            f"selector_top_k {c.selector_top_k} vs target vocabulary {target.vocab_size}"))
    if drafter.is_dflash2:
        declared, applied = (c.output_multiplier, c.final_logit_softcapping), target.logit_transform
        checks.append(Check("logit_transform", _transform_fits(declared, applied),
                            f"drafter output_multiplier/final_logit_softcapping {declared} vs target "
                            f"{target.model_type} logits transform {applied}"))
    if target.has_window_layers:
        checks.append(Check("block_size", c.block_size <= target.max_block,
                            f"drafter block_size {c.block_size} vs target rollback room {target.max_block} rows "
                            "(sliding-window layers keep that many rows beyond their window)"))
    return checks


def _same(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6)


def _is_identity(transform) -> bool:
    return _same(transform[0], 1.0) and _same(transform[1], None)


def _transform_fits(declared, applied) -> bool:
    # Plain target logits take any declared transform (the selector applies it);
    # otherwise the drafter must declare none or exactly the target's own.
    return _is_identity(applied) or _is_identity(declared) or all(map(_same, declared, applied))


def unary_transform(drafter: Drafter, target: Target) -> tuple[float, Optional[float]]:
    """(output multiplier, softcap) the selector must still apply to the top-K
    of `target.lm_head` logits.

    The reference applies the drafter's declared values once, to the raw head
    projection. `Target.lm_head` already returns the target's final logits, so
    when the target applies the same transform itself (Muse Glimmer: 0.196 and
    20, as its released drafter declares) nothing is left to apply; doing it
    again would square the multiplier and cap twice.
    """
    c = drafter.config
    if _is_identity(target.logit_transform):
        return c.output_multiplier, c.final_logit_softcapping
    return 1.0, None


def check_compatibility(drafter: Drafter, target: Target) -> None:
    """Raise `IncompatibleError` on the first failing check."""
    for check in compatibility_report(drafter, target):
        if not check.ok:
            raise IncompatibleError(f"incompatible pair: {check.message}")
