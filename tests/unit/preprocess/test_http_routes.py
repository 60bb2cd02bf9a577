"""The HTTP routes are one table: every RPC of InferenceService that Envoy maps from a surface's
path is served by a ROUTES entry (or is a native RPC's JSON twin), each made method has its RPC's
shape (a streaming RPC an async generator, a unary one a coroutine), and a path parameter reaches
the endpoint under its field name."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

from mstar.v1 import inference_service_pb2 as api

from services.preprocess import http_routes
from services.preprocess.http_routes import ROUTES, HttpRoutes
from services.preprocess.surfaces.http import Frame

SERVICE = api.DESCRIPTOR.services_by_name["InferenceService"]
NATIVE = {"Generate", "GenerateStream", "Session", "Append", "Cancel", "ListModels",
          "GenerateJson", "GenerateStreamJson", "SessionJson", "AppendJson", "CancelJson"}


def test_every_rpc_is_native_or_a_route_and_has_its_shape():
    assert set(ROUTES) | NATIVE == set(SERVICE.methods_by_name) and not set(ROUTES) & NATIVE
    for name in ROUTES:
        method, made = SERVICE.methods_by_name[name], getattr(HttpRoutes, name)
        if method.server_streaming:
            assert inspect.isasyncgenfunction(made), name
        else:
            assert inspect.iscoroutinefunction(made), name


def test_a_path_parameter_and_the_body_reach_the_endpoint(monkeypatch):
    seen = []

    async def endpoint(req, scope):
        seen.append((req.params, req.body, req.content_type))
        yield Frame(b"{}", "application/json")

    routes = SimpleNamespace(responses=SimpleNamespace(retrieve=endpoint, create=endpoint))

    async def fake_unary(endpoint_, context, **parts):
        parts.pop("check", None)
        return await first(endpoint_, parts)

    async def fake_stream(endpoint_, context, **parts):
        yield await first(endpoint_, parts)

    async def first(endpoint_, parts):
        req = SimpleNamespace(params=parts.get("params", {}), body=parts.get("body", b""),
                              content_type=parts.get("content_type", ""))
        async for frame in endpoint_(req, None):
            return frame

    routes._unary, routes._stream = fake_unary, fake_stream

    async def go():
        await HttpRoutes.RetrieveModelResponse(routes, api.RetrieveModelResponseRequest(response_id="resp_1"), None)
        body = http_routes.httpbody_pb2.HttpBody(data=b'{"input": "x"}', content_type="application/json")
        async for _ in HttpRoutes.CreateModelResponse(routes, body, None):
            pass

    asyncio.run(go())
    assert seen == [({"response_id": "resp_1"}, b"", ""), ({}, b'{"input": "x"}', "application/json")]
