"""The server interceptor every mstar gRPC server runs (GrpcServer installs it).

For each call to an mstar service (`/mstar.` methods; grpc's own health and reflection services
pass through untouched) it:
- takes the request id from the `x-request-id` metadata Envoy forwards (or makes one) and puts it
  in `request_id.current` for the call's task, so every log line carries it;
- decodes the request message(s) itself: bytes that are not a valid message end the call with
  INVALID_ARGUMENT / UNDECODABLE_MESSAGE (grpc's own handling answered UNKNOWN, or for a stream
  stopped reading without ending it);
- turns an exception that escaped the servicer into INTERNAL with the stack in the log and no
  exception text for the client (an MstarError keeps its own status); never UNKNOWN;
- writes one access log line per call (logger `mstar.access`): method, status code, duration.

A decode error inside a client stream is raised to the servicer as an MstarError from the request
iterator; the servicers end the stream with it (their readers already do so for their own
MstarErrors). Tracing and metrics interceptors are separate: pass them to GrpcServer before this
one so they see the final status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from services.common import errors, grpc_errors, request_id
from services.common.logs import stamp_request_ids

log = logging.getLogger(__name__)
access_log = logging.getLogger("mstar.access")

_SERVICE_PREFIX = "/mstar."


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        stamp_request_ids()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(_SERVICE_PREFIX):
            return handler
        return _wrap(handler, handler_call_details.method)


class _Call:
    """One RPC: its id, clock and outcome, logged once when it ends."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.started = time.monotonic()
        self.code = errors.Code.OK
        self.peer = context.peer()  # read now: the context must not be touched while it is torn down
        self.token = request_id.current.set(request_id.from_metadata(context.invocation_metadata()))
        grpc_errors.aborted_with.set(None)

    def failed(self, exc: BaseException) -> errors.MstarError:
        """The status a servicer exception becomes (logged with its stack if it is a bug)."""
        if isinstance(exc, errors.MstarError):
            return exc
        return errors.unexpected(exc, self.method, log)

    def end(self, exc: BaseException | None) -> None:
        if isinstance(exc, asyncio.CancelledError):
            self.code = errors.Code.CANCELLED
        elif isinstance(exc, grpc.aio.AbortError):  # the servicer aborted with its own status
            self.code = grpc_errors.aborted_with.get() or errors.Code.UNKNOWN
        access_log.info(
            "rpc",
            extra={
                "rpc": self.method,
                "code": self.code.name,
                "duration_ms": round((time.monotonic() - self.started) * 1000, 2),
                "peer": self.peer,
            },
        )
        request_id.current.reset(self.token)


def _decoder(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    message_type = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    name = message_type.full_name if message_type is not None else "the request message"

    def decode(raw: bytes) -> Any:
        if deserialize is None:
            return raw
        try:
            return deserialize(raw)
        except Exception:  # noqa: BLE001 - any decode failure is the sender's malformed bytes
            raise errors.invalid_argument(
                "", f"the message is not a valid {name} ({len(raw)} bytes)", reason="UNDECODABLE_MESSAGE"
            ) from None

    return decode


def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    decode = _decoder(handler.request_deserializer)

    async def abort(call: _Call, exc: BaseException) -> None:
        if _call_is_over(exc):
            # grpc's own state error (e.g. the servicer's abort after the deadline passed): there
            # is no status left to send, and a second abort would only raise "Abort already called".
            call.code = errors.Code.CANCELLED
            raise exc
        err = call.failed(exc)
        call.code = err.code
        await grpc_errors.abort(call.context, err)

    async def unary_unary(raw: bytes, context):
        call, outcome = _Call(method, context), None
        try:
            return await handler.unary_unary(decode(raw), context)
        except (grpc.aio.AbortError, asyncio.CancelledError) as exc:
            outcome = exc
            raise
        except Exception as exc:  # noqa: BLE001 - becomes a status; never escapes as UNKNOWN
            await abort(call, exc)
        finally:
            call.end(outcome)

    async def unary_stream(raw: bytes, context):
        call, outcome = _Call(method, context), None
        try:
            async for response in handler.unary_stream(decode(raw), context):
                yield response
        except (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit) as exc:
            outcome = exc if not isinstance(exc, GeneratorExit) else asyncio.CancelledError()
            raise
        except Exception as exc:  # noqa: BLE001
            await abort(call, exc)
        finally:
            call.end(outcome)

    async def stream_stream(raw_iterator, context):
        call, outcome = _Call(method, context), None
        try:
            async for response in handler.stream_stream(_decoded(raw_iterator, decode), context):
                yield response
        except (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit) as exc:
            outcome = exc if not isinstance(exc, GeneratorExit) else asyncio.CancelledError()
            raise
        except Exception as exc:  # noqa: BLE001
            await abort(call, exc)
        finally:
            call.end(outcome)

    async def stream_unary(raw_iterator, context):
        call, outcome = _Call(method, context), None
        try:
            return await handler.stream_unary(_decoded(raw_iterator, decode), context)
        except (grpc.aio.AbortError, asyncio.CancelledError) as exc:
            outcome = exc
            raise
        except Exception as exc:  # noqa: BLE001
            await abort(call, exc)
        finally:
            call.end(outcome)

    serializer = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary_unary, None, serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(unary_stream, None, serializer)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(stream_stream, None, serializer)
    return grpc.stream_unary_rpc_method_handler(stream_unary, None, serializer)


def _call_is_over(exc: BaseException) -> bool:
    """An error grpc raised about the call itself (ExecuteBatchError, UsageError, ...): the RPC has
    ended (cancelled, deadline passed) while the servicer still worked on it."""
    return type(exc).__module__ == "grpc._cython.cygrpc"


async def _decoded(raw_iterator, decode: Callable[[bytes], Any]) -> AsyncIterator[Any]:
    async for raw in raw_iterator:
        yield decode(raw)
