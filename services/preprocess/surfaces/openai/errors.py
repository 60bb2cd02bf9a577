"""OpenAI's error shape and the HTTP status -> error `type` table: the one authority for both.

Errors after a stream's first byte are rendered here (an in-band chunk); errors that end the call
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
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled_error",
    500: "server_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
# The type of a status the table does not name, by its class.
SERVER_ERROR_TYPE = "server_error"
CLIENT_ERROR_TYPE = "invalid_request_error"


def error_type(http_status: int) -> str:
    return ERROR_TYPES.get(http_status, SERVER_ERROR_TYPE if http_status >= 500 else CLIENT_ERROR_TYPE)


def error_body(message: str, type_: str, code: str | None, param: str | None) -> dict:
    """The error object: `code` is mstar's ErrorInfo reason in lower case, `param` the field."""
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def error_object(err: MstarError) -> dict:
    return error_body(err.message, error_type(err.http_status), err.reason.lower() if err.reason else None,
                      err.field_violations[0].field if err.field_violations else None)
