"""The one place where mstar errors become wire errors.

Domain code raises (or reports) `MstarError`; servicers turn it into a `google.rpc.Status` with an
`ErrorInfo` (AIP-193), `BadRequest` field violations and `RetryInfo` where they apply, or into a
`RequestFailed` for per-request failures on a stream. The HTTP status of each code is the one
Envoy's transcoder uses, so `RequestFailed.http_status` matches what an HTTP client would see.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "mstar.dev"


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


@dataclass
class FieldViolation:
    field: str
    description: str


@dataclass
class MstarError(Exception):
    """An error with a canonical code and a stable machine-readable reason (UPPER_SNAKE_CASE)."""

    code: Code
    reason: str
    message: str
    field_violations: list[FieldViolation] = field(default_factory=list)
    retry_after_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code.name}/{self.reason}: {self.message}"

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


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


# ---- wire forms


def to_rpc_status(err: MstarError) -> status_pb2.Status:
    """google.rpc.Status with ErrorInfo first, then BadRequest / RetryInfo when they apply."""
    status = status_pb2.Status(code=int(err.code), message=err.message)
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN, metadata=err.metadata)
    status.details.add().Pack(info)
    if err.field_violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in err.field_violations
            ]
        )
        status.details.add().Pack(bad)
    if err.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(err.retry_after_s * 1e9))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def to_grpc_status(err: MstarError) -> grpc.Status:
    """For `context.abort_with_status` (sets grpc-status-details-bin for rich clients and Envoy)."""
    return rpc_status.to_status(to_rpc_status(err))


async def abort(context: grpc.aio.ServicerContext, err: MstarError) -> None:
    """End an aio RPC with `err`. Raises (never returns), like context.abort."""
    await context.abort_with_status(to_grpc_status(err))
