"""The one place where mstar errors become gRPC errors: servicers and interceptors only.

Domain code raises (or reports) `errors.MstarError`, which imports neither grpc nor protobuf, so
the engine core stays pure (tests/unit/generation/test_core_purity.py). At the service boundary an
MstarError becomes a `google.rpc.Status` with an `ErrorInfo` (AIP-193), `BadRequest` field
violations and `RetryInfo` where they apply; a failed call's status becomes an MstarError again
(a preprocess replica relaying a peer's answer).
"""

from __future__ import annotations

import collections
from contextvars import ContextVar

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.errors import Code, MstarError

DOMAIN = "mstar.dev"


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


# Trailing metadata of a refused request. Nothing was sent before the refusal, so gRPC sends it
# as a trailers-only reply: a response *header*, which Envoy's retry policy can match.
REFUSED = "x-mstar-refused"


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    pass


def to_grpc_status(err: MstarError) -> grpc.Status:
    """For `context.abort_with_status` (sets grpc-status-details-bin for rich clients and Envoy)."""
    status = rpc_status.to_status(to_rpc_status(err))
    if not err.refused:
        return status
    return _Status(status.code, status.details, (*status.trailing_metadata, (REFUSED, err.reason)))


# The code the current RPC was aborted with, for the access log (interceptors.py): reading it
# back from the grpc context is not safe once the call is being torn down.
aborted_with: ContextVar[Code | None] = ContextVar("aborted_with", default=None)


async def abort(context: grpc.aio.ServicerContext, err: MstarError) -> None:
    """End an aio RPC with `err`. Raises (never returns), like context.abort."""
    aborted_with.set(err.code)
    await context.abort_with_status(to_grpc_status(err))


def from_grpc_error(exc: grpc.RpcError) -> MstarError:
    """Rebuild an MstarError from a failed call (code, message, ErrorInfo reason): a preprocess
    replica relays a peer's answer to a forwarded Append/Cancel (services/preprocess/peers.py)."""
    code = Code(exc.code().value[0]) if exc.code() is not None else Code.UNKNOWN
    message = exc.details() or code.name
    reason = code.name
    status = rpc_status.from_call(exc) if hasattr(exc, "trailing_metadata") else None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
    return MstarError(code, reason, message)
