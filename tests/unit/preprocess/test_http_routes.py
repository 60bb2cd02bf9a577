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


class _Scope:
    warnings = ("max_tokens clamped to 2",)
    closed = False
    budget = SimpleNamespace(charge=lambda n, is_append: None)

    def close(self):
        self.closed = True


class _Context:
    def __init__(self):
        self.headers = []

    def invocation_metadata(self):
        return (("x-request-id", "abc"), ("authorization", "secret"))

    async def send_initial_metadata(self, headers):
        self.headers.append(tuple(headers))


def test_a_path_parameter_and_the_body_reach_the_endpoint_and_headers_go_first(monkeypatch):
    seen, scope = [], _Scope()
    monkeypatch.setattr(http_routes.call, "scope_of", lambda runner, context: scope)

    async def endpoint(req, runs):
        seen.append((req.params, req.body, req.content_type, req.headers))
        yield Frame(b"{}", "application/json")
        yield Frame(b"[]", "application/json")

    routes = HttpRoutes()
    routes.runner, routes.responses = None, SimpleNamespace(retrieve=endpoint, create=endpoint)

    async def go():
        context = _Context()
        one = await routes.RetrieveModelResponse(api.RetrieveModelResponseRequest(response_id="resp_1"), context)
        body = http_routes.httpbody_pb2.HttpBody(data=b'{"input": "x"}', content_type="application/json")
        streamed = [out.data async for out in routes.CreateModelResponse(body, context)]
        return one, streamed, context.headers

    one, streamed, headers = asyncio.run(go())
    assert one.data == b"{}" and streamed == [b"{}", b"[]"] and scope.closed
    assert seen == [({"response_id": "resp_1"}, b"", "", {"x-request-id": "abc"}),
                    ({}, b'{"input": "x"}', "application/json", {"x-request-id": "abc"})]
    # the admission warnings, once per call, with its first frame
    assert headers == [(("warning", '299 - "max_tokens clamped to 2"'),)] * 2
