"""The domain's errors: what the engine, preprocess and the surfaces raise or report.

`MstarError` carries a canonical code, a stable reason, a capped message, field violations and a
retry hint; the constructors below keep call sites short and reasons consistent. Plain Python: no
grpc, no protobuf, so the engine core can use it (tests/unit/generation/test_core_purity.py).
Servicers turn an MstarError into a `google.rpc.Status` with services/common/grpc_errors.py, or
into a `RequestFailed` for per-request failures on a stream. The HTTP status of each code is the
one Envoy's transcoder uses, so `RequestFailed.http_status` matches what an HTTP client would see.
"""

from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass, field


class Code(enum.IntEnum):
    """google.rpc.Code values, usable without protobuf."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# gRPC code -> HTTP status, as Envoy's grpc_json_transcoder maps them (shared/notes/envoy.md).
HTTP_STATUS = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


# Caps on every string an error carries to a client (status message, trailer, RequestFailed, SSE
# error event) or a log line. Errors quote client input only through `quote` (a short, escaped
# prefix): an error that echoed a 1 MB id once made Envoy reset the shared upstream connection
# and failed every other client's streams (issue 13, finding 10). 1024 = RequestFailed.message's
# declared bound (protos/mstar/v1/messages.proto; tests/unit/contracts/test_bounds.py keeps them equal).
MAX_MESSAGE_CHARS = 1024
MAX_FIELD_CHARS = 256
QUOTE_CHARS = 48
# At most this many field violations in one error (the first ones, in field order): the contract's
# check and the HTTP bodies' validation alike.
MAX_VIOLATIONS = 16


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """A client-supplied value as it may appear in an error: repr-escaped (control characters,
    quotes, lone surrogates), at most `limit` characters of it, and its full length if cut."""
    text = value if isinstance(value, str) else repr(value)
    shown = repr(text[:limit])
    return shown if len(text) <= limit else f"{shown}... ({len(text)} characters)"


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")


def field_name(key: str) -> str:
    """A client-chosen key (JSON field, Struct key) as a field path element: as is when it is a
    short plain name, else quoted (short, escaped)."""
    return key if _PLAIN_NAME.fullmatch(key) else quote(key, 32)


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters and made encodable as UTF-8 (a lone surrogate would make
    the status itself fail to serialize)."""
    if len(text) > limit:
        text = text[: limit - 15] + "... (truncated)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class FieldViolation:
    field: str
    description: str

    def __post_init__(self) -> None:
        self.field = bounded(self.field, MAX_FIELD_CHARS)
        self.description = bounded(self.description, MAX_FIELD_CHARS)


@dataclass
class MstarError(Exception):
    """An error with a canonical code and a stable machine-readable reason (UPPER_SNAKE_CASE)."""

    code: Code
    reason: str
    message: str
    field_violations: list[FieldViolation] = field(default_factory=list)
    retry_after_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    # Refused before anything started (draining, not ready, no generation replica): another
    # replica may run it. Sent as the REFUSED trailer, on which Envoy retries (deploy/envoy).
    refused: bool = False

    def __post_init__(self) -> None:
        self.message = bounded(self.message, MAX_MESSAGE_CHARS)
        self.metadata = {bounded(k, 64): bounded(v, MAX_FIELD_CHARS) for k, v in self.metadata.items()}
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code.name}/{self.reason}: {self.message}"

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def renamed(err: MstarError, renames: tuple[tuple[str, str], ...]) -> MstarError:
    """`err` with its field path renamed by the first (prefix, public name) pair that matches it
    (the engine's `structured_output.json_schema` -> OpenAI's `response_format.json_schema.schema`),
    in the violations, the metadata and the message's leading field. Unchanged if none matches."""
    if not err.field_violations or not renames:
        return err
    old = err.field_violations[0].field
    for prefix, public in renames:
        if old == prefix or old.startswith(prefix + ".") or old.startswith(prefix + "["):
            new = public + old[len(prefix):]
            break
    else:
        return err
    message = new + err.message[len(old):] if err.message.startswith(old) else err.message
    violations = [FieldViolation(new, v.description) if v.field == old else v for v in err.field_violations]
    metadata = {**err.metadata, "field": new} if "field" in err.metadata else err.metadata
    return MstarError(err.code, err.reason, message, violations, err.retry_after_s, metadata)


# ---- constructors for the common cases (keep call sites short and reasons consistent)


def invalid_argument(field_name: str, description: str, reason: str = "INVALID_FIELD") -> MstarError:
    return MstarError(
        Code.INVALID_ARGUMENT,
        reason,
        f"{field_name}: {description}" if field_name else description,
        field_violations=[FieldViolation(field_name, description)] if field_name else [],
        metadata={"field": field_name} if field_name else {},
    )


def not_found(what: str, reason: str = "NOT_FOUND") -> MstarError:
    return MstarError(Code.NOT_FOUND, reason, what)


def already_exists(what: str, reason: str = "ALREADY_EXISTS") -> MstarError:
    return MstarError(Code.ALREADY_EXISTS, reason, what)


def failed_precondition(what: str, reason: str) -> MstarError:
    return MstarError(Code.FAILED_PRECONDITION, reason, what)


def permission_denied(what: str, reason: str = "PERMISSION_DENIED") -> MstarError:
    return MstarError(Code.PERMISSION_DENIED, reason, what)


def resource_exhausted(what: str, reason: str, retry_after_s: float | None = 1.0) -> MstarError:
    return MstarError(Code.RESOURCE_EXHAUSTED, reason, what, retry_after_s=retry_after_s)


def unavailable(what: str, reason: str = "BACKEND_UNAVAILABLE", retry_after_s: float | None = 1.0) -> MstarError:
    return MstarError(Code.UNAVAILABLE, reason, what, retry_after_s=retry_after_s)


def cancelled(what: str = "cancelled by the client") -> MstarError:
    return MstarError(Code.CANCELLED, "CANCELLED", what)


def internal(what: str, reason: str = "INTERNAL") -> MstarError:
    return MstarError(Code.INTERNAL, reason, what)


def unexpected(exc: BaseException, where: str, logger: logging.Logger) -> MstarError:
    """A bug surfaced as `exc`: log its stack here, hand the client INTERNAL without its text."""
    logger.error("unexpected error in %s", where, exc_info=exc)
    return internal(f"internal error in {where}; the server log has the details", "INTERNAL")


def from_code(code: int) -> Code:
    """A wire status code as a Code. An unset (0 = OK) or unknown code on a failure is INTERNAL:
    a failure must never read as OK/HTTP 200 (issue 13, finding 7)."""
    if code == Code.OK or code not in Code._value2member_map_:
        return Code.INTERNAL
    return Code(code)
