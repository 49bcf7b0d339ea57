"""Typed reads of request JSON: a wrong type is a 400, a bad value a 422.

Both protocol layers read their bodies through these, so every field error
names the field and what it should be, in one sentence.
"""

from typing import Any, Optional

from .errors import ApiError

_FLOAT_MAX = 1.7976931348623157e308
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          list: "an array", dict: "an object"}


def get(body: dict, key: str, kind: type, default: Any = None, *, required: bool = False, where: str = "") -> Any:
    """body[key] checked to be of `kind` (ints count as floats; bools are not ints); `where`:
    the path of `body` in the request, for the message ("tools[2]" names "tools[2].name")."""
    if where:
        try:
            return get(body, key, kind, default, required=required)
        except ApiError as e:
            field = f"{where}.{key}"
            raise ApiError(e.status, e.message.replace(f"'{key}'", f"'{field}'", 1), field) from None
    if key not in body or body[key] is None:
        if required:
            raise ApiError(400, f"'{key}' is required", key)
        return default
    value = body[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > _FLOAT_MAX:  # float() would raise OverflowError
            raise ApiError(422, f"'{key}' {shown(value)} is out of range: no setting takes a number this large", key)
        value, ok = float(value), True
    if not ok:
        raise ApiError(400, f"'{key}' must be {_NAMES.get(kind, kind.__name__)}, not {json_type(value)}", key)
    return value


def check_range(key: str, value, low=None, high=None, *, low_open: bool = False) -> None:
    """422 when `value` lies outside [low, high] (or (low, high] with low_open)."""
    if value is None:
        return
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and value > high
    if below or above:
        lo = "(" if low_open else "["
        span = f"{lo}{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ApiError(422, f"'{key}' {shown(value)} is out of range: it must be in {span}", key)


def stop_list(body: dict, key: str, limit: Optional[int] = None) -> tuple[str, ...]:
    """A stop field: one string or an array of strings."""
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ApiError(400, f"'{key}' must be a string or an array of strings", key)
    if limit is not None and len(value) > limit:
        raise ApiError(422, f"'{key}' has {len(value)} entries: at most {limit} are allowed", key)
    return tuple(s for s in value if s)


def shown(value) -> str:
    """A number as an error message shows it: a huge integer cut to its first digits."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text.lstrip('-'))} digits)"


def json_type(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"
