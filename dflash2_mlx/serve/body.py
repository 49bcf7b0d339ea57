"""A request body read as one JSON object, within the server's size limit."""

import json

from starlette.requests import Request

from .errors import ApiError


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object: 413 past `limit` bytes, 400 when not JSON."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body has {int(declared):,} bytes, over this server's limit of {limit:,}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the body is over this server's limit of {limit:,} bytes")
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" ({e.msg} at line {e.lineno} column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise ApiError(400, f"the body is not valid JSON{where}") from None
    except RecursionError:
        raise ApiError(400, "the body nests arrays or objects too deeply to read") from None
    except ValueError as e:  # an integer past Python's digit limit, or NaN / Infinity (_no_constant)
        raise ApiError(400, f"the body is not valid JSON ({str(e).split(';')[0]})") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    return value


def _no_constant(name: str):
    # Python's json reads NaN and Infinity, which JSON has not: they would pass every range check.
    raise ValueError(f"{name} is not a JSON number")
