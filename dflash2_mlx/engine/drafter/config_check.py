"""Types and ranges of a drafter config.json, checked before any of it is used.

A hand-edited or foreign config with `"hidden_size": "64"` must fail as one
line naming the key, not as a TypeError from inside the model build. The
expected type of each key is read from the dataclass annotation, so a field
added to DrafterConfig is checked without touching this file.
"""

import json
import math
import typing
from dataclasses import fields

from ...errors import ConfigError

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
