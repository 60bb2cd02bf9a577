"""Anthropic's error shape and the HTTP status -> error `type` table: the one authority for both.

Errors after a stream's first byte are rendered here (an `error` event); errors that end the call
before it are reshaped by Envoy's Lua filter, whose table and body deploy/envoy/render.py renders
from this module (`ERROR_TYPES`, the two fallbacks, `error_body`), so the two cannot drift
(tests/unit/surfaces/test_error_tables.py).
"""

from __future__ import annotations

from services.common.errors import MstarError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# The type of a status the table does not name, by its class.
SERVER_ERROR_TYPE = "api_error"
CLIENT_ERROR_TYPE = "invalid_request_error"


def error_type(http_status: int) -> str:
    return ERROR_TYPES.get(http_status, SERVER_ERROR_TYPE if http_status >= 500 else CLIENT_ERROR_TYPE)


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    """The error object (Anthropic's has no code or field: the message names the field)."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def error_object(err: MstarError) -> dict:
    return error_body(err.message, error_type(err.http_status))


def cancelled_error() -> dict:
    """Anthropic has no "cancelled" stop reason: a cancelled message ends with this error."""
    return error_body("the request was cancelled", ERROR_TYPES[500])
