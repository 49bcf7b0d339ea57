"""The one error type the serving layers raise; each protocol formats it.

A request that is wrong gets a status and one sentence saying what to fix,
never a traceback: the protocol layer turns `ApiError` into the OpenAI or
Anthropic error object.
"""

from typing import Optional

# Status -> (OpenAI error type, Anthropic error type).
ERROR_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
}


class ApiError(Exception):
    """A failed request: HTTP status, one-line message, the field at fault, and
    any headers the answer carries (Retry-After on 429)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    def openai_body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, ERROR_TYPES[500])[0]
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}

    def anthropic_body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, ERROR_TYPES[500])[1]
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def error_line(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def internal_line(e: BaseException) -> str:
    """A bug, as the one line a client (and the log) gets."""
    return f"internal error: {error_line(e)}"


def log_failure(log, what: str, e: BaseException) -> str:
    """Log a bug as one line (the traceback only at DEBUG: `serve --debug`); returns the line."""
    line = internal_line(e)
    log.error(f"{what}: {line}")
    log.debug(what, exc_info=e)
    return line
