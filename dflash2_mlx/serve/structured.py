"""Structured-output fields: OpenAI's `response_format` (and the Responses
API's `text.format`) and Anthropic's `output_config.format` read into a
`Grammar`, compiled at once so a schema the grammar engine cannot use is the
request's 400, never a silent free answer."""

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


def read_output_config(body: dict) -> Optional[Grammar]:
    """Anthropic's structured output: `output_config.format` ({"type": "json_schema", "schema": {...}};
    the beta's top-level `output_format` is the same object) as a grammar, None without one, a 400
    naming the field for any shape this server does not read (never a silently free answer)."""
    config = get(body, "output_config", dict, {})
    unknown = sorted(set(config) - {"format", "effort"})  # effort: how hard a hosted model works; no knob here
    if unknown:
        raise ApiError(400, f"'output_config.{unknown[0]}' is not supported by this server (it reads "
                            f"output_config.format)", f"output_config.{unknown[0]}")
    value, key = config.get("format"), "output_config.format"
    if body.get("output_format") is not None:
        if value is not None:
            raise ApiError(400, "'output_format' and 'output_config.format' both set the format: send one",
                           "output_format")
        value, key = body["output_format"], "output_format"
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "json_schema":
        raise ApiError(400, f"'{key}' must be {{\"type\": \"json_schema\", \"schema\": {{...}}}} (the one "
                            f"output format this server reads)", key)
    if not isinstance(value.get("schema"), dict):
        raise ApiError(400, f"'{key}.schema' must be a JSON schema object", f"{key}.schema")
    try:  # Anthropic's error body has no param: the message names the field
        return checked(Grammar.json_schema(value["schema"]), f"{key}.schema")
    except ApiError as e:
        raise ApiError(400, f"'{key}.schema': {e.message}", f"{key}.schema") from None


def checked(grammar: Grammar, param: str) -> Grammar:
    """`grammar`, once it compiles; else the request's 400 with the engine's reason."""
    try:
        grammar.compiled()
    except DFlashError as e:
        raise ApiError(400, str(e), param) from None
    return grammar
