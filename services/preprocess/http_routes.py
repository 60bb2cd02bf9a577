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
gives the body the API's own error shape).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from google.api import httpbody_pb2

from services.common import contract, errors
from services.preprocess import call
from services.preprocess.runner import RequestRunner
from services.preprocess.surfaces.anthropic import endpoints as anthropic
from services.preprocess.surfaces.http import Frame, HttpRequest
from services.preprocess.surfaces.openai import embeddings
from services.preprocess.surfaces.openai import endpoints as openai
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.vllm import endpoints as vllm

log = logging.getLogger(__name__)

Endpoint = Callable[..., AsyncIterator[Frame]]
# Request headers a surface may read (gRPC metadata keys are lower-case).
_HEADERS = ("anthropic-version", "anthropic-beta", "openai-organization", "openai-project", "x-request-id")


class HttpRoutes:
    """Mixin for the InferenceServicer: one thin method per HTTP route."""

    runner: RequestRunner
    responses: ResponsesApi
    created: int

    async def _stream(self, endpoint: Endpoint, context, body: bytes = b"", content_type: str = "",
                      params: dict[str, str] | None = None, *args) -> AsyncIterator[httpbody_pb2.HttpBody]:
        scope = call.scope_of(self.runner, context)
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if k in _HEADERS}
        req = HttpRequest(body=body, content_type=content_type, headers=metadata, params=params or {})
        sent = False
        try:
            scope.budget.charge(len(body), is_append=False)  # on arrival, before any work
            async with aclosing(endpoint(req, scope, *args)) as frames:
                async for frame in frames:
                    if not sent and frame.headers:
                        await context.send_initial_metadata(frame.headers)
                    sent = True
                    yield httpbody_pb2.HttpBody(content_type=frame.content_type, data=frame.data)
        except errors.MstarError as err:
            if sent:  # surfaces report failures in-band once streaming; this is a bug, not a client error
                log.error("surface raised after its first frame", extra={"error": str(err)})
            await errors.abort(context, err)
        finally:
            scope.close()

    async def _unary(self, endpoint: Endpoint, context, *, body: bytes = b"", content_type: str = "",
                     params: dict[str, str] | None = None, args: tuple = (), check=None) -> httpbody_pb2.HttpBody:
        if check is not None:  # a request message with path parameters: its declared bounds first
            try:
                contract.check(check)
            except errors.MstarError as err:
                await errors.abort(context, err)
        async with aclosing(self._stream(endpoint, context, body, content_type, params, *args)) as frames:
            async for frame in frames:
                return frame
        raise errors.internal("the endpoint produced no response")

    # ---- OpenAI

    async def CreateChatCompletion(self, request, context):
        async for out in self._stream(openai.chat_completions, context, request.data, request.content_type):
            yield out

    async def CreateCompletion(self, request, context):
        async for out in self._stream(openai.completions, context, request.data, request.content_type):
            yield out

    async def CreateEmbedding(self, request, context):
        return await self._unary(embeddings.create_embedding, context, body=request.data,
                                 content_type=request.content_type)

    async def ListOpenAIModels(self, request, context):
        return await self._unary(openai.list_models, context, args=(self.created,))

    async def RetrieveOpenAIModel(self, request, context):
        return await self._unary(openai.retrieve_model, context, params={"model": request.model},
                                 args=(self.created,), check=request)

    # ---- Anthropic

    async def CreateMessage(self, request, context):
        async for out in self._stream(anthropic.create_message, context, request.data, request.content_type):
            yield out

    async def CountMessageTokens(self, request, context):
        return await self._unary(anthropic.count_tokens, context, body=request.data,
                                 content_type=request.content_type)

    # ---- OpenAI Responses

    async def CreateModelResponse(self, request, context):
        async for out in self._stream(self.responses.create, context, request.data, request.content_type):
            yield out

    async def RetrieveModelResponse(self, request, context):
        return await self._unary(self.responses.retrieve, context, params={"response_id": request.response_id},
                                 check=request)

    async def DeleteModelResponse(self, request, context):
        return await self._unary(self.responses.delete, context, params={"response_id": request.response_id},
                                 check=request)

    async def CancelModelResponse(self, request, context):
        return await self._unary(self.responses.cancel, context, params={"response_id": request.response_id},
                                 check=request)

    # ---- vLLM-compatible utilities

    async def Tokenize(self, request, context):
        return await self._unary(vllm.tokenize, context, body=request.data, content_type=request.content_type)

    async def Detokenize(self, request, context):
        return await self._unary(vllm.detokenize, context, body=request.data, content_type=request.content_type)

    async def GetVersion(self, request, context):
        return await self._unary(vllm.version, context)
