"""A scripted InferenceService (no model) behind which the Envoy config is tested in isolation.

    python tests/unit/deploy/fake_upstream.py --port N [--name NAME] [--refuse]

The prompt text picks the behaviour, so each Envoy test is one HTTP request:
  "too long"  -> INVALID_ARGUMENT / PROMPT_TOO_LONG with a BadRequest violation on `text`
  "overload"  -> RESOURCE_EXHAUSTED / QUEUE_FULL before any message
  "fail late" -> accepted, one chunk, then an in-band `failed` (UNAVAILABLE)
  anything    -> accepted, keep_alive, chunks "Hello" + " world", complete
The HTTP surfaces (OpenAI, Anthropic, Responses, ...) are the real ones (services/preprocess/
http_routes.py) over a scripted runner that yields these domain events.
For replica tests: ListModels and GET /v1/models answer the model id NAME (which replica
served), Generate's text says whether an `mstar-forwarded` header arrived ("forwarded?") or the call's
deadline as the servicer sees it ("deadline?"), and --refuse answers
every call UNAVAILABLE before any message (a draining replica that Envoy's health check has not
noticed yet).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from types import SimpleNamespace

from mstar.v1 import inference_service_pb2 as ipb
from mstar.v1 import inference_service_pb2_grpc as ipb_grpc

from services.common import errors, grpc_errors
from services.common.finish import FinishReason
from services.common.server import GrpcServer
from services.preprocess import wire
from services.preprocess.http_routes import HttpRoutes
from services.preprocess.request import Accepted, Chunk, Complete, Failed, KeepAlive, RequestSpec
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.responses.store import ResponseStore


async def script(spec: RequestSpec):
    text = spec.text or (spec.messages[-1].content if spec.messages else "")
    rid = spec.request_id
    if "too long" in text:
        raise errors.invalid_argument("text", "prompt is 9000 tokens, context is 8192", reason="PROMPT_TOO_LONG")
    if "overload" in text:
        raise errors.resource_exhausted("queue full", "QUEUE_FULL")
    yield Accepted(rid, spec.client_request_id, prompt_tokens=3, max_tokens=16)
    yield KeepAlive(rid)
    if "fail late" in text:
        yield Chunk(rid, 0, "partial", ())
        yield Failed(rid, errors.unavailable("generation backend lost", reason="BACKEND_UNAVAILABLE"))
        return
    for i, piece in enumerate(("Hello", " world")):
        await asyncio.sleep(0.01)
        yield Chunk(rid, i, piece, (1,))
    yield Complete(rid, FinishReason.LENGTH, "", prompt_tokens=3, cached_prompt_tokens=0, completion_tokens=2, chunks=2)


class FakeRunner:
    """What the surfaces use of the RequestRunner, scripted; its model is called `name`."""

    def __init__(self, name: str = "fake") -> None:
        self.model = SimpleNamespace(
            name=name, context_length=8192, input_modalities=frozenset({"text"}), family="llama",
            answers_to=lambda asked: asked in (name, "default"),
            tokenizer=SimpleNamespace(decode=lambda ids: "x" * len(ids), token_bytes=lambda t: b"x", vocab_size=100))
        self.numerics: dict = {}  # no generation backend behind it (RequestRunner.numerics)
        self.deps = SimpleNamespace(keepalive_s=2.0)  # what the surfaces read of RequestRunner.deps

    def scope(self, client: str = ""):
        budget = SimpleNamespace(charge=lambda size, is_append: None)
        return SimpleNamespace(runner=self, run=script, close=lambda: None, close_after=lambda seconds: None,
                               budget=budget, client=client, warnings=[])

    def check_model(self, model: str) -> None:
        pass

    def prompt_token_ids(self, spec: RequestSpec) -> list[int]:
        return [1, 2, 3]

    def cancel(self, request_id: str) -> bool:
        return False


class FakeInference(HttpRoutes, ipb_grpc.InferenceServiceServicer):
    def __init__(self, name: str = "fake", refuse: bool = False) -> None:
        self.name = name
        self.refuse = refuse
        self.runner = FakeRunner(name)
        self.responses = ResponsesApi(ResponseStore(Path(":memory:")))
        self.created = 1700000000

    async def _maybe_refuse(self, context) -> None:
        if self.refuse:
            refusal = errors.unavailable("server is draining", "DRAINING")
            refusal.refused = True
            await grpc_errors.abort(context, refusal)

    async def GenerateStream(self, request, context):
        await self._maybe_refuse(context)
        try:
            async for event in script(wire.request_spec(request.input, "GenerateStream")):
                yield wire.stream_event(event)
        except errors.MstarError as err:
            await grpc_errors.abort(context, err)

    async def Generate(self, request, context):
        await self._maybe_refuse(context)
        if request.input.text == "forwarded?":
            seen = any(k == "mstar-forwarded" for k, _ in context.invocation_metadata())
            return ipb.GenerateResponse(request_id="req-1", text=f"{self.name}:{seen}")
        if request.input.text == "deadline?":  # the seconds left that the real servicer would use
            return ipb.GenerateResponse(request_id="req-1", text=repr(context.time_remaining()))
        text = []
        try:
            async for event in script(wire.request_spec(request.input, "Generate")):
                if isinstance(event, Chunk):
                    text.append(event.text)
        except errors.MstarError as err:
            await grpc_errors.abort(context, err)
        return ipb.GenerateResponse(request_id="req-1", text="".join(text))

    async def ListModels(self, request, context):
        await self._maybe_refuse(context)
        return ipb.ListModelsResponse(object="list", data=[ipb.Model(id=self.name, object="model", owned_by="mstar")])

    async def ListOpenAIModels(self, request, context):
        await self._maybe_refuse(context)
        return await super().ListOpenAIModels(request, context)

    async def Cancel(self, request, context):
        return ipb.CancelResponse(request_id=request.request_id, cancelled=False)


async def main(port: int, name: str, refuse: bool) -> None:
    server = GrpcServer("fake-preprocess", "127.0.0.1", port)
    server.add(ipb_grpc.add_InferenceServiceServicer_to_server, FakeInference(name, refuse), "mstar.v1.InferenceService")
    await server.start()
    server.state.serve()
    await server.wait_for_shutdown(0.5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="fake")
    parser.add_argument("--refuse", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.name, args.refuse))
