"""Structured-output fields: OpenAI's `response_format` (and the Responses
API's `text.format`) read into a `Grammar`, compiled at once so a schema the
grammar engine cannot use is the request's 400, never a silent free answer."""

from typing import Optional

from ..engine.grammar import Grammar
from ..errors import DFlashError
from .errors import ApiError
from .fields import get


def read_response_format(body: dict, key: str = "response_format") -> Optional[Grammar]:
    """None for no field or {"type": "text"}; a 400 for anything this server does not understand."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, f"'{key}' must be an object such as {{\"type\": \"json_object\"}}", key)
    kind = get(value, "type", str, required=True)
    if kind == "text":
        return None
    if kind == "json_object":
        return checked(Grammar.json_object(), key)
    if kind == "json_schema":
        # Chat completions nest it ({"json_schema": {"name", "schema", "strict"}}); the
        # Responses API's text.format holds "name" and "schema" itself.
        spec = value.get("json_schema", value)
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ApiError(400, f"'{key}.json_schema.schema' must be a JSON schema object", f"{key}.json_schema")
        return checked(Grammar.json_schema(spec["schema"]), f"{key}.json_schema.schema")
    raise ApiError(400, f"'{key}.type' '{kind}' is not one of text, json_object, json_schema", f"{key}.type")


def checked(grammar: Grammar, param: str) -> Grammar:
    """`grammar`, once it compiles; else the request's 400 with the engine's reason."""
    try:
        grammar.compiled()
    except DFlashError as e:
        raise ApiError(400, str(e), param) from None
    return grammar
