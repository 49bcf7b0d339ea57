"""The drafter config: one dataclass that reads both released formats.

Field names are the checkpoint's own keys. `from_dict` flattens the
`dflash_config` block (nested values win over top-level ones, since newer
revisions moved `block_size` there) and refuses variants this engine does not
implement, naming the key.
"""

import json
import math
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional

from ...errors import ConfigError
from .activations import ACTIVATIONS

# Keys that may sit at the top level or inside `dflash_config`.
_NESTED_KEYS = (
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "num_target_layers",
    "conv_group_size",
    "conv_kernel_size",
    "selector_rank",
    "selector_top_k",
    "output_multiplier",
    "final_logit_softcapping",
    "projector_type",
    "partial_rotary_factor",
    "attention_sink_bias",
)

DFLASH_ARCH = "DFlashDraftModel"
DFLASH2_ARCH = "DFlash2DraftModel"
_PLAIN_PROJECTORS = (None, "linear", "fc")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The layer ids the reference trainers use when a config names none."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [
        round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)
    ]


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    head_dim: Optional[int] = None
    rope_theta: Optional[float] = None
    rope_scaling: Optional[dict] = None
    rope_parameters: Optional[dict] = None
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    hidden_act: str = "silu"
    layer_types: Optional[list[str]] = None
    # As transformers' Qwen3Config: the window exists only with use_sliding_window
    # (default False); without layer_types, layers from max_window_layers on slide.
    use_sliding_window: bool = False
    sliding_window: Optional[int] = 4096
    max_window_layers: int = 28
    architectures: list[str] = field(default_factory=lambda: [DFLASH_ARCH])
    block_size: int = 16
    target_layer_ids: Optional[list[int]] = None
    mask_token_id: Optional[int] = None
    num_target_layers: Optional[int] = None
    # DFlash 2 additions; present only in DFlash2DraftModel checkpoints.
    conv_group_size: int = 16
    conv_kernel_size: int = 2
    selector_rank: int = 256
    selector_top_k: int = 16
    output_multiplier: float = 1.0
    final_logit_softcapping: Optional[float] = None

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "DrafterConfig":
        flat = dict(config)
        nested = config.get("dflash_config") or {}
        if not isinstance(nested, dict):
            raise ConfigError(f"drafter config.json: dflash_config is {nested!r}; it must be a JSON object")
        for key in _NESTED_KEYS:
            if nested.get(key) is not None:
                flat[key] = nested[key]
        check_config_values(cls, flat)  # types and ranges, naming the key, before any is used
        _refuse_unimplemented(flat)
        known = {f.name for f in fields(cls)}
        required = [
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        ]
        missing = [name for name in required if flat.get(name) is None]
        if missing:
            raise ConfigError(
                f"drafter config.json lacks {', '.join(missing)}: is this a DFlash drafter folder?"
            )
        if "sliding_window" in flat and flat["sliding_window"] is None:
            if flat.get("use_sliding_window") and "sliding_attention" in (flat.get("layer_types") or []):
                raise ConfigError(
                    "drafter has sliding_attention layers and use_sliding_window but sliding_window "
                    "is null: set the window in config.json"
                )
            # transformers keeps an explicit null: no window at all (not the 4096 default).
            flat["use_sliding_window"] = False
        # A null in the file means "use the default", as in transformers.
        return cls(**{k: v for k, v in flat.items() if k in known and v is not None})

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rope_parameters:
            if self.rope_theta is None:
                self.rope_theta = self.rope_parameters.get("rope_theta")
            if self.rope_scaling is None and self.rope_parameters.get("rope_type", "default") != "default":
                self.rope_scaling = self.rope_parameters
        if self.rope_theta is None:
            self.rope_theta = 1_000_000.0
        if not self.use_sliding_window:
            self.sliding_window = None  # sliding_attention layers then see the whole context
        if self.layer_types is None:
            self.layer_types = [
                "sliding_attention" if self.sliding_window is not None and i >= self.max_window_layers
                else "full_attention"
                for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"drafter layer_types has {len(self.layer_types)} entries for "
                f"{self.num_hidden_layers} layers: fix config.json"
            )
        for kind in self.layer_types:
            if kind not in ("full_attention", "sliding_attention"):
                raise ConfigError(f"drafter layer_types entry '{kind}' is not supported")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"drafter sliding_window {self.sliding_window} must be at least 1")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"drafter hidden_act '{self.hidden_act}' is not supported (supported: "
                f"{', '.join(ACTIVATIONS)})"
            )
        if self.block_size < 2:
            raise ConfigError(f"drafter block_size {self.block_size} must be at least 2")
        if self.is_dflash2:
            if self.conv_kernel_size != 2:
                raise ConfigError(
                    f"conv_kernel_size {self.conv_kernel_size} is not supported: "
                    "DFlash 2 uses a two-tap convolution"
                )
            if self.hidden_size % self.conv_group_size:
                raise ConfigError(
                    f"conv_group_size {self.conv_group_size} does not divide "
                    f"hidden_size {self.hidden_size}"
                )
        if self.target_layer_ids is None and self.num_target_layers is not None:
            self.target_layer_ids = default_target_layer_ids(
                self.num_target_layers, self.num_hidden_layers
            )

    @property
    def is_dflash2(self) -> bool:
        return DFLASH2_ARCH in (self.architectures or [])

    @property
    def kind(self) -> str:
        return "dflash2" if self.is_dflash2 else "dflash"

    def resolve_layer_ids(self, num_target_layers: int) -> list[int]:
        """Layer ids to tap, falling back to the default formula for the target."""
        if self.target_layer_ids is not None:
            return list(self.target_layer_ids)
        return default_target_layer_ids(num_target_layers, self.num_hidden_layers)


def _refuse_unimplemented(flat: dict[str, Any]) -> None:
    if not flat.get("architectures") and "dflash_config" not in flat and "mask_token_id" not in flat:
        raise ConfigError(
            "config.json has neither architectures nor dflash_config: this is not a DFlash "
            "drafter (did you pass the target as --drafter?)"
        )
    arch = flat.get("architectures") or [DFLASH_ARCH]
    if not any(a in (DFLASH_ARCH, DFLASH2_ARCH) for a in arch):
        raise ConfigError(
            f"architectures {arch} is not a DFlash drafter (expected {DFLASH_ARCH} or "
            f"{DFLASH2_ARCH}): pass a DFlash drafter as --drafter"
        )
    if flat.get("projector_type") not in _PLAIN_PROJECTORS:
        raise ConfigError(
            f"projector_type '{flat['projector_type']}' is not implemented "
            "(only the linear fc projector is)"
        )
    prf = flat.get("partial_rotary_factor")
    if prf is not None and float(prf) != 1.0:
        raise ConfigError(f"partial_rotary_factor {prf} is not implemented (only 1.0 is)")
    if flat.get("is_causal"):
        raise ConfigError(
            "is_causal: true is not implemented: DFlash drafters attend non-causally within the block"
        )
    if flat.get("attention_sink_bias"):
        raise ConfigError("attention_sink_bias is not implemented by this engine")


# -- types and ranges, checked before any value is used ------------------------------
# A hand-edited or foreign config with `"hidden_size": "64"` must fail as one
# line naming the key, not as a TypeError from inside the model build. The
# expected type of each key is read from the dataclass annotation, so a field
# added to DrafterConfig is checked without touching this code.

# Sizes and counts that must be at least 1.
POSITIVE = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "head_dim", "max_position_embeddings", "sliding_window", "block_size", "num_target_layers",
    "conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k", "rms_norm_eps", "rope_theta",
    "max_window_layers",
}
# Ids (target_layer_ids, mask_token_id) are checked against the target by the Pair, which can say what fits.


def check_config_values(cls, values: dict, what: str = "drafter") -> None:
    """Raise ConfigError on the first value of `values` that does not fit `cls`'s field
    (`what` names the checkpoint in the message)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # annotations this Python cannot resolve (a foreign ModelArgs): nothing to check
        return
    for f in fields(cls):
        if f.name not in values or values[f.name] is None:  # null means "the default"
            continue
        value, expected = values[f.name], hints[f.name]
        if not _fits(value, expected):
            raise ConfigError(f"{what} config.json: {f.name} is {_show(value)}; it must be {_describe(expected)}")
        numbers = value if isinstance(value, list) else [value]
        if f.name in POSITIVE and any(x <= 0 for x in numbers):
            raise ConfigError(f"{what} config.json: {f.name} is {_show(value)}; it must be positive")
    heads, kv = values.get("num_attention_heads"), values.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0 and heads % kv:
        raise ConfigError(f"{what} config.json: num_attention_heads {heads} is not a multiple of "
                          f"num_key_value_heads {kv}")


def _fits(value, tp) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return any(_fits(value, a) for a in args if a is not type(None))
    if tp is typing.Any:
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    if tp is dict or origin is dict:
        return isinstance(value, dict)
    if tp is list or origin is list:
        return isinstance(value, list) and all(_fits(x, args[0]) for x in value) if args else isinstance(value, list)
    return True  # a type this checker does not know: the dataclass decides


def _describe(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is list or tp is list:
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s" if args else "a list"
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string",
            dict: "a JSON object"}.get(origin or tp, str(tp))


def _show(value) -> str:
    text = json.dumps(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
    return f"{text} ({kind})"
