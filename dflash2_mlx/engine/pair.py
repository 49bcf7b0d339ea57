"""The pair: a target and the drafter checked against it, made once.

Everything that depends on both sides is worked out here and nowhere else:
the target layers the drafter taps, the logit transform the selector still
applies, the mask token, and which block sizes are valid. Each failed check
names the mismatched pair and what would fit, because a drafter trained for
another target otherwise runs silently at ~0 % acceptance.
"""

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..errors import BlockSizeError, IncompatibleError
from .drafter.model import Drafter
from .logit_transform import IDENTITY, LogitTransform, same_transform
from .target.adapter import Target


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str


@dataclass(frozen=True)
class Pair:
    """A target and (optionally) its drafter; make it with `Pair.make`.

    Without a drafter the pair decodes plainly (autoregressive).
    """

    target: Target
    drafter: Optional[Drafter] = None
    # Target layers whose outputs the drafter reads (empty without a drafter).
    layer_ids: tuple[int, ...] = ()
    # What the DFlash 2 selector still applies to the target's head logits.
    selector_transform: LogitTransform = IDENTITY
    mask_token_id: Optional[int] = None

    @classmethod
    def make(cls, target: Target, drafter: Optional[Drafter] = None) -> "Pair":
        """Check that `drafter` fits `target` (raises `IncompatibleError`) and pair them."""
        if drafter is None:
            return cls(target)
        for check in compatibility_report(drafter, target):
            if not check.ok:
                raise IncompatibleError(f"incompatible pair: {check.message}")
        c = drafter.config
        return cls(target, drafter, tuple(layer_ids_for(drafter, target)),
                   selector_transform(drafter, target), c.mask_token_id)

    @property
    def kind(self) -> str:
        """'ar' (no drafter), 'dflash' or 'dflash2'."""
        return "ar" if self.drafter is None else self.drafter.config.kind

    @property
    def max_block_size(self) -> int:
        """The drafter's block size (anchor included); 1 without a drafter."""
        return 1 if self.drafter is None else self.drafter.config.block_size

    def block_size(self, requested: Optional[int] = None, name: str = "block size") -> int:
        """The block size to decode with: `requested` if this drafter can draft
        it, else the drafter's own when None; 1 for plain decoding. `name` is
        how the error calls the value (the CLI passes its flag)."""
        if self.drafter is None:
            return 1
        B = self.max_block_size if requested is None else requested
        if not 2 <= B <= self.max_block_size:
            raise BlockSizeError(
                f"{name} {B} is outside [2, {self.max_block_size}]: a block holds the anchor and at least one "
                f"draft, and this drafter's block_size {self.max_block_size} is the most it was trained to draft"
            )
        return B

    def without_drafter(self) -> "Pair":
        """The same target decoding plainly (the `--ar` baseline)."""
        return replace(self, drafter=None, layer_ids=(), selector_transform=IDENTITY, mask_token_id=None)

    def identity(self) -> dict:
        """What a measurement or a cached row of this pair is valid for: both models
        (fingerprinted), their activation dtypes and quantization (drafter: None without one)."""
        target, drafter = self.target, self.drafter
        facts = {"target": fingerprint(target.model, [target.model_type, target.num_layers, target.hidden_size,
                                                      target.vocab_size]),
                 "drafter": None,
                 "dtype": {"target": str(target.activation_dtype), "drafter": None},
                 "quantization": {"target": quantization_of(target.model), "drafter": None}}
        if drafter is not None:
            facts["drafter"] = fingerprint(drafter, [drafter.config.kind, len(drafter.layers),
                                                     drafter.config.hidden_size, drafter.config.block_size])
            facts["dtype"]["drafter"] = str(drafter.activation_dtype)
            facts["quantization"]["drafter"] = quantization_of(drafter)
        return facts


def layer_ids_for(drafter: Drafter, target: Target) -> list[int]:
    """The target layers `drafter` taps: its config's ids, or the default
    spacing over the target's depth (the one place ids are resolved)."""
    return drafter.config.resolve_layer_ids(target.num_layers)


def compatibility_report(drafter: Drafter, target: Target) -> list[Check]:
    """All checks, passing or not (for `doctor`)."""
    c = drafter.config
    Ht, n_layers = target.hidden_size, target.num_layers
    ids = layer_ids_for(drafter, target)
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
        declared, applied = declared_transform(drafter), target.logit_transform
        checks.append(Check("logit_transform", _transform_fits(declared, applied),
                            f"drafter output_multiplier/final_logit_softcapping {tuple(declared)} vs target "
                            f"{target.model_type} logits transform {tuple(applied)}"))
    if target.has_window_layers:
        checks.append(Check("block_size", c.block_size <= target.max_block,
                            f"drafter block_size {c.block_size} vs target rollback room {target.max_block} rows "
                            "(sliding-window layers keep that many rows beyond their window)"))
    return checks


def declared_transform(drafter: Drafter) -> LogitTransform:
    """The logit transform a DFlash 2 drafter's selector was trained on."""
    return LogitTransform(drafter.config.output_multiplier, drafter.config.final_logit_softcapping)


def _transform_fits(declared: LogitTransform, applied: LogitTransform) -> bool:
    # Plain target logits take any declared transform (the selector applies it);
    # otherwise the drafter must declare none or exactly the target's own.
    return applied.is_identity or declared.is_identity or same_transform(declared, applied)


def selector_transform(drafter: Drafter, target: Target) -> LogitTransform:
    """The transform the selector must still apply to the top-K of `target.lm_head` logits.

    The reference applies the drafter's declared values once, to the raw head
    projection. `Target.lm_head` already returns the target's final logits, so
    when the target applies the same transform itself (Muse Glimmer: 0.196 and
    20, as its released drafter declares) nothing is left to apply; doing it
    again would square the multiplier and cap twice.
    """
    if target.logit_transform.is_identity:
        return declared_transform(drafter)
    return IDENTITY


# Elements sampled from every tensor for `fingerprint`: enough that two checkpoints of one
# architecture (a fine-tune, another seed, norms left at one) differ in some of them, few
# enough to cost nothing.
SAMPLES_PER_TENSOR = 64


def fingerprint(module: nn.Module, shape: list) -> str:
    """Shape facts plus every tensor's name, shape, dtype and SAMPLES_PER_TENSOR elements
    spread over it. (Norm weights alone were not enough: two look-alike checkpoints with
    norms left at one shared a fingerprint, and so a prompt-cache folder.)"""
    h = hashlib.sha1(json.dumps([str(x) for x in shape]).encode())
    params = sorted(tree_flatten(module.parameters()))
    picks = []
    for _, p in params:
        flat = p.reshape(-1)
        n = min(SAMPLES_PER_TENSOR, flat.size)
        picks.append(flat[mx.array(np.linspace(0, flat.size - 1, n).astype(np.int64))] if n else flat)
    mx.eval(picks)
    for (name, p), pick in zip(params, picks):
        h.update(json.dumps([name, list(p.shape), str(p.dtype)]).encode())
        h.update(memoryview(pick).tobytes())
    return h.hexdigest()[:16]


def quantization_of(module: nn.Module) -> list:
    """(bits, group size) of every quantized layer kind in use, sorted."""
    found = {(m.bits, m.group_size) for _, m in module.named_modules() if hasattr(m, "bits")}
    return [list(q) for q in sorted(found)]  # lists: keys built from this must survive a JSON round trip

