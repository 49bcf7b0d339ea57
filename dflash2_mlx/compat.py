"""Does this drafter fit this target? Checked before any generation.

Each failure names the mismatched pair and what would fit, because a drafter
trained for another target otherwise runs silently at ~0 % acceptance.
"""

from dataclasses import dataclass

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
    return checks


def check_compatibility(drafter: Drafter, target: Target) -> None:
    """Raise `IncompatibleError` on the first failing check."""
    for check in compatibility_report(drafter, target):
        if not check.ok:
            raise IncompatibleError(f"incompatible pair: {check.message}")
