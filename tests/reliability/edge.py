"""Envoy (the real rendered config) in front of a recording stand-in for the preprocess service,
for edge cases where what matters is what Envoy lets through: API keys, rate limits, slowloris.

The stand-in is a grpc.aio server on a background loop: health SERVING, the models listing (GET
/v1/models, ListOpenAIModels; ListModels for gRPC) recording the request metadata it received, and a slow GenerateStream (one chunk every 50 ms) so a test can hold
a stream open while it hammers the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
from google.api import httpbody_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

from deploy.envoy.render import VARIANTS
from services.stack.envoy import start_envoy
from services.stack.ports import free_port

SERVICE = "mstar.v1.InferenceService"


class Recorder:
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []  # one per upstream call, in arrival order


def _handlers(recorder: Recorder) -> grpc.GenericRpcHandler:
    async def list_models(request, context):
        seen = {k: v for k, v in context.invocation_metadata()}
        recorder.metadata.append(seen)
        if seen.get("x-test-fail") == "unavailable":  # R28: a failure Envoy must not replay
            await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in says unavailable")
        return api.ListModelsResponse(object="list")

    async def list_openai_models(request, context):
        await list_models(request, context)
        return httpbody_pb2.HttpBody(content_type="application/json", data=b'{"object":"list","data":[]}')

    async def generate_stream(request, context):
        recorder.metadata.append({k: v for k, v in context.invocation_metadata()})
        yield api.GenerateStreamResponse(accepted=api.RequestAccepted(request_id="fake"))
        for i in range(20):
            await asyncio.sleep(0.05)
            yield api.GenerateStreamResponse(chunk=pb.ResultChunk(request_id="fake", index=i, text="x"))
        yield api.GenerateStreamResponse(complete=pb.RequestComplete(request_id="fake"))

    return grpc.method_handlers_generic_handler(SERVICE, {
        "ListModels": grpc.unary_unary_rpc_method_handler(
            list_models, api.ListModelsRequest.FromString, api.ListModelsResponse.SerializeToString),
        "ListOpenAIModels": grpc.unary_unary_rpc_method_handler(
            list_openai_models, api.ListOpenAIModelsRequest.FromString, httpbody_pb2.HttpBody.SerializeToString),
        "GenerateStream": grpc.unary_stream_rpc_method_handler(
            generate_stream, api.GenerateStreamRequest.FromString, api.GenerateStreamResponse.SerializeToString),
        # POST /v1/generate_stream: the raw-body RPC (services/preprocess/native_json.py says why).
        "GenerateStreamJson": grpc.unary_stream_rpc_method_handler(
            generate_stream, httpbody_pb2.HttpBody.FromString, api.GenerateStreamResponse.SerializeToString),
    })


@dataclasses.dataclass
class Edge:
    http_url: str
    port: int
    recorder: Recorder
    envoy: object


@contextlib.contextmanager
def edge(workdir: Path, **settings) -> Iterator[Edge]:
    """Envoy with EnvoySettings overrides in front of the recording stand-in; both torn down."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    recorder = Recorder()
    upstream_port = free_port()

    async def serve() -> grpc.aio.Server:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(recorder),))
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        for name in ("", SERVICE):
            await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        server.add_insecure_port(f"127.0.0.1:{upstream_port}")
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    http_port, admin_port = free_port(), free_port()
    config = dataclasses.replace(VARIANTS["local"], http_port=http_port, admin_port=admin_port,
                                 upstream_port=upstream_port, **settings)
    envoy = start_envoy(config, workdir)
    try:
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 30
        while True:  # ready when Envoy's health check sees the stand-in (GET /health 200)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline and envoy.alive(), envoy.log_tail()
            time.sleep(0.1)
        yield Edge(url, http_port, recorder, envoy)
    finally:
        envoy.stop(5)
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
