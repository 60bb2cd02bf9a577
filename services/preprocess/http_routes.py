"""The HTTP surfaces as InferenceService RPCs: google.api.HttpBody in, HttpBody frames out.

Envoy hands each HTTP request over as an HttpBody (raw body + Content-Type; path parameters in
small request messages for GET/DELETE routes) and streams the HttpBody responses back as they
come. This module is the only place where a surface endpoint (services/preprocess/surfaces/)
meets gRPC: it builds the surface's HttpRequest (headers from the call's metadata), runs the
endpoint in a RunScope that the call's done-callback closes (client cancel, disconnect and
deadline all end the requests the call started) and that carries the call's client (fair
admission) and input budget (charged with the body on arrival), sends the first frame's headers as initial
metadata (Envoy turns them into response headers) and turns an error raised before the first
frame into the call's status (Envoy maps the code to the HTTP status; the per-route Lua filter
gives the body the API's own error shape). What a call's requests were told on admission (a
clamped max_tokens) goes out as Warning headers with the first frame.

The native RPCs' HTTP routes are here too (GenerateJson, ...): their body arrives raw so that an
unknown field is an error, not dropped (native_json.py), becomes the typed request, and runs the
typed RPC, whose messages the transcoder prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from google.api import httpbody_pb2
from mstar.v1 import inference_service_pb2 as api

from services.common import contract, errors, grpc_errors
from services.preprocess import call, json_array, native_json, wire
from services.preprocess import limits as caps
from services.preprocess.request import Failed
from services.preprocess.runner import RequestRunner
from services.preprocess.surfaces.anthropic import endpoints as anthropic
from services.preprocess.surfaces.http import Frame, HttpRequest
from services.preprocess.surfaces.openai import embeddings
from services.preprocess.surfaces.openai import endpoints as openai
from services.preprocess.surfaces.openai.fanout import merged
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.vllm import endpoints as vllm

log = logging.getLogger(__name__)

Endpoint = Callable[..., AsyncIterator[Frame]]
# Request headers a surface may read (gRPC metadata keys are lower-case).
_HEADERS = ("anthropic-version", "anthropic-beta", "openai-organization", "openai-project", "x-request-id")


def warning_headers(warnings) -> tuple[tuple[str, str], ...]:
    """What the requests were told on admission (a clamped max_tokens) as HTTP Warning headers,
    RFC 7234 style: `299 - "max_tokens clamped to 1790"` (299: a persistent warning). The
    native API has its own `warnings` field too; an HTTP surface has no other place for them."""
    out = []
    for text in warnings:
        quoted = text.encode("ascii", "replace").decode().replace("\\", "\\\\").replace('"', '\\"')
        out.append(("warning", f'299 - "{quoted}"'))
    return tuple(out)


class _HeldHeaders:
    """A unary call's context whose initial metadata waits for the response (a typed RPC sends
    its headers just before it returns), so that the response's Warning headers can join them."""

    def __init__(self, context) -> None:
        self._context = context
        self.headers: tuple[tuple[str, str], ...] = ()

    def __getattr__(self, name: str):
        return getattr(self._context, name)

    async def send_initial_metadata(self, metadata) -> None:
        self.headers = tuple(metadata)


class HttpRoutes:
    """Mixin for the InferenceServicer: the native RPCs' JSON routes, and one method per entry of
    ROUTES (below), made from the table."""

    runner: RequestRunner
    responses: ResponsesApi
    created: int

    @contextlib.asynccontextmanager
    async def _served(self, context, body: bytes, content_type: str, params: dict[str, str]):
        """One HTTP call's scope: its HttpRequest (headers from the metadata), the RunScope the
        call's done-callback closes, the body charged on arrival, an MstarError as the call's
        status. Yields (request, scope, first) where `await first(frame)` sends the first frame's
        headers (and the admission warnings) as initial metadata."""
        scope = call.scope_of(self.runner, context)
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if k in _HEADERS}
        req = HttpRequest(body=body, content_type=content_type, headers=metadata, params=params)
        sent = False

        async def first(frame: Frame) -> None:
            nonlocal sent
            headers = frame.headers + warning_headers(scope.warnings)
            if not sent and headers:
                await context.send_initial_metadata(headers)
            sent = True

        try:
            scope.budget.charge(len(body), is_append=False)  # on arrival, before any work
            yield req, scope, first
        except errors.MstarError as err:
            if sent:  # surfaces report failures in-band once streaming; this is a bug, not a client error
                log.error("surface raised after its first frame", extra={"error": str(err)})
            await grpc_errors.abort(context, err)
        finally:
            scope.close()

    # ---- native RPCs for HTTP/JSON clients

    async def _read_json(self, context, body: bytes, message, root: str) -> None:
        try:
            native_json.body_message(body, message, root)
        except errors.MstarError as err:
            await grpc_errors.abort(context, err)

    async def GenerateJson(self, request, context):
        typed = api.GenerateRequest()
        await self._read_json(context, request.data, typed.input, "input")
        held = _HeldHeaders(context)
        response = await self.Generate(typed, held)
        headers = held.headers + warning_headers(response.complete.warnings)
        if headers:
            await context.send_initial_metadata(headers)
        return response

    async def GenerateStreamJson(self, request, context):
        typed = api.GenerateStreamRequest()
        await self._read_json(context, request.data, typed.input, "input")
        async with aclosing(self.GenerateStream(typed, context)) as events:
            async for event in events:
                if event.HasField("accepted") and event.accepted.warnings:  # the first event
                    await context.send_initial_metadata(warning_headers(event.accepted.warnings))
                yield event

    async def SessionJson(self, request_iterator, context):
        refusals: asyncio.Queue = asyncio.Queue()
        element_cap = self.runner.deps.limits.max_input_bytes  # a whole stream's input

        async def actions():
            elements = json_array.ArrayElements(element_cap)
            try:
                async for piece in request_iterator:
                    for raw in elements.feed(piece.data):
                        try:
                            yield native_json.body_message(raw, api.SessionRequest(), "")
                        except errors.MstarError as err:  # refused like any action; the session goes on
                            await refusals.put(wire.session_event(Failed("", err)))
                elements.end()
            except json_array.TooLarge as exc:
                raise caps.input_caps_error(str(exc)) from None
            except ValueError as exc:  # not a JSON array: nothing after this point can be read
                raise errors.invalid_argument("body", f"a session body {exc}", reason="INVALID_JSON") from None
            finally:
                await refusals.put(None)

        async def refused():
            while (event := await refusals.get()) is not None:
                yield event

        async with aclosing(merged([self.Session(actions(), context), refused()])) as events:
            async for _, event in events:
                yield event

    async def AppendJson(self, request, context):
        typed = api.AppendRequest()
        await self._read_json(context, request.body.data, typed.append, "append")
        if typed.append.request_id not in ("", request.request_id):
            await grpc_errors.abort(context, errors.invalid_argument(
                "append.request_id", "must be the request id in the path, or absent"))
        typed.append.request_id = request.request_id
        return await self.Append(typed, context)

    async def CancelJson(self, request, context):
        typed = api.CancelRequest()
        await self._read_json(context, request.body.data, typed, "")
        if typed.request_id not in ("", request.request_id):
            await grpc_errors.abort(context, errors.invalid_argument(
                "request_id", "must be the request id in the path, or absent"))
        typed.request_id = request.request_id
        return await self.Cancel(typed, context)


def _route(name: str, pick: Callable[[HttpRoutes], Endpoint]):
    """The RPC method serving HTTP route `name` with the endpoint `pick` chooses. Its shape is the
    RPC's declaration: a google.api.HttpBody request is the body, any other request message holds
    path parameters (its fields, bounds checked first); a streaming RPC streams the frames, and
    its method is the one generator between the surface's frames and grpc."""
    method = api.DESCRIPTOR.services_by_name["InferenceService"].methods_by_name[name]
    body_in = method.input_type.full_name == "google.api.HttpBody"

    async def parts(request, context) -> tuple[bytes, str, dict[str, str]]:
        if body_in:
            return request.data, request.content_type, {}
        try:  # a request message with path parameters: its declared bounds first
            contract.check(request)
        except errors.MstarError as err:
            await grpc_errors.abort(context, err)
        return b"", "", {f.name: getattr(request, f.name) for f in method.input_type.fields}

    if method.server_streaming:
        async def streamed(self, request, context):
            async with self._served(context, *await parts(request, context)) as (req, scope, first):
                async with aclosing(pick(self)(req, scope)) as frames:
                    async for frame in frames:
                        await first(frame)
                        yield httpbody_pb2.HttpBody(content_type=frame.content_type, data=frame.data)
        streamed.__name__ = streamed.__qualname__ = name
        return streamed

    async def unary(self, request, context):
        async with self._served(context, *await parts(request, context)) as (req, scope, first):
            async with aclosing(pick(self)(req, scope)) as frames:
                async for frame in frames:
                    await first(frame)
                    return httpbody_pb2.HttpBody(content_type=frame.content_type, data=frame.data)
        raise errors.internal("the endpoint produced no response")
    unary.__name__ = unary.__qualname__ = name
    return unary


# The HTTP surfaces' routes: RPC name -> the surface endpoint serving it (docs/http.md lists the
# paths; protos/mstar/v1/inference_service.proto binds each RPC to its path).
ROUTES: dict[str, Callable[[HttpRoutes], Endpoint]] = {
    # OpenAI
    "CreateChatCompletion": lambda s: openai.chat_completions,
    "CreateCompletion": lambda s: openai.completions,
    "CreateEmbedding": lambda s: embeddings.create_embedding,
    "ListOpenAIModels": lambda s: functools.partial(openai.list_models, created=s.created),
    "RetrieveOpenAIModel": lambda s: functools.partial(openai.retrieve_model, created=s.created),
    # Anthropic
    "CreateMessage": lambda s: anthropic.create_message,
    "CountMessageTokens": lambda s: anthropic.count_tokens,
    # OpenAI Responses (stored per API key: the servicer's ResponsesApi)
    "CreateModelResponse": lambda s: s.responses.create,
    "RetrieveModelResponse": lambda s: s.responses.retrieve,
    "DeleteModelResponse": lambda s: s.responses.delete,
    "CancelModelResponse": lambda s: s.responses.cancel,
    # vLLM-compatible utilities
    "Tokenize": lambda s: vllm.tokenize,
    "Detokenize": lambda s: vllm.detokenize,
    "GetVersion": lambda s: vllm.version,
}
for _name, _pick in ROUTES.items():
    setattr(HttpRoutes, _name, _route(_name, _pick))
