"""The raw HTTP body of an OpenAI request (a google.api.HttpBody) → a JSON object, or a 400.

Envoy hands the service the body bytes and Content-Type untouched, so every malformed-input case
is decided here: wrong content type, empty body, invalid UTF-8, invalid JSON, NaN/Infinity
literals (Python's json accepts them, JSON does not), lone UTF-16 surrogate escapes (Python's json
accepts "\ud800" too, and the string then cannot become UTF-8: it was a 500 quoting the Python
exception, issue 13 finding 4), and a top level that is not an object.
"""

from __future__ import annotations

import json

from services.common import errors
from services.preprocess.openai.fields import type_name


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def decode_json_object(data: bytes, content_type: str) -> dict:
    """Parse the body; errors name the `body` pseudo-field so clients see where it went wrong."""
    # An absent Content-Type is tolerated (some clients omit it); a different one is a mistake,
    # typically curl's default application/x-www-form-urlencoded.
    if content_type and not _is_json_media_type(content_type):
        raise errors.invalid_argument(
            "body", f"Content-Type must be application/json, got {errors.quote(content_type)}", reason="BAD_CONTENT_TYPE"
        )
    if not data.strip():
        raise errors.invalid_argument(
            "body", "empty request body; expected a JSON object", reason="INVALID_JSON"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.invalid_argument(
            "body", f"not valid UTF-8 at byte {exc.start}", reason="INVALID_JSON"
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise errors.invalid_argument("body", f"invalid JSON: {exc}", reason="INVALID_JSON") from None
    if not isinstance(value, dict):
        raise errors.invalid_argument(
            "body", f"must be a JSON object, got {type_name(value)}", reason="INVALID_JSON"
        )
    try:  # one pass in C over every key and string: they must all be encodable as UTF-8
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise errors.invalid_argument(
            "body", "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff come in pairs)",
            reason="INVALID_JSON",
        ) from None
    return value
