"""A scripted InferenceService (no model) behind which the Envoy config is tested in isolation.

    python tests/unit/deploy/fake_upstream.py --port N [--name NAME] [--refuse]

The prompt text picks the behaviour, so each Envoy test is one HTTP request:
  "too long"  -> INVALID_ARGUMENT / PROMPT_TOO_LONG with a BadRequest violation on `text`
  "overload"  -> RESOURCE_EXHAUSTED / QUEUE_FULL before any message
  "fail late" -> accepted, one chunk, then an in-band `failed` (UNAVAILABLE)
  anything    -> accepted, keep_alive, chunks "Hello" + " world", complete
The OpenAI RPCs are the real services/preprocess/openai handlers over this fake `run`.
For replica tests: ListModels answers the model id NAME (which replica served), Generate's text
says whether an `mstar-forwarded` header arrived, and --refuse answers every call UNAVAILABLE
before any message (a draining replica that Envoy's health check has not noticed yet).
"""

from __future__ import annotations

import argparse
import asyncio

from mstar.v1 import inference_service_pb2 as ipb
from mstar.v1 import inference_service_pb2_grpc as ipb_grpc
from mstar.v1 import messages_pb2 as mpb

from services.common import errors
from services.common.server import GrpcServer
from services.preprocess import openai


async def fake_run(inp: mpb.PreprocessInput, context):
    text = inp.text or (inp.messages[-1].content if inp.messages else "")
    rid = inp.request_id or "req-1"
    if "too long" in text:
        await errors.abort(context, errors.invalid_argument("text", "prompt is 9000 tokens, context is 8192",
                                                            reason="PROMPT_TOO_LONG"))
    if "overload" in text:
        await errors.abort(context, errors.resource_exhausted("queue full", "QUEUE_FULL"))
    yield ipb.GenerateStreamResponse(accepted=ipb.RequestAccepted(request_id=rid, prompt_tokens=3))
    yield ipb.GenerateStreamResponse(keep_alive=ipb.KeepAlive(request_id=rid))
    if "fail late" in text:
        yield ipb.GenerateStreamResponse(chunk=mpb.ResultChunk(request_id=rid, text="partial"))
        yield ipb.GenerateStreamResponse(failed=mpb.RequestFailed(
            request_id=rid, message="generation backend lost", code=14, http_status=503,
            reason="BACKEND_UNAVAILABLE"))
        return
    for piece in ("Hello", " world"):
        await asyncio.sleep(0.01)
        yield ipb.GenerateStreamResponse(chunk=mpb.ResultChunk(request_id=rid, text=piece, token_ids=[1]))
    yield ipb.GenerateStreamResponse(complete=mpb.RequestComplete(
        request_id=rid, finish_reason=mpb.FINISH_REASON_LENGTH,
        usage=mpb.Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)))


class FakeInference(ipb_grpc.InferenceServiceServicer):
    def __init__(self, name: str = "fake", refuse: bool = False) -> None:
        self.name = name
        self.refuse = refuse

    async def _maybe_refuse(self, context) -> None:
        if self.refuse:
            refusal = errors.unavailable("server is draining", "DRAINING")
            refusal.refused = True
            await errors.abort(context, refusal)

    async def GenerateStream(self, request, context):
        await self._maybe_refuse(context)
        async for event in fake_run(request.input, context):
            yield event

    async def Generate(self, request, context):
        await self._maybe_refuse(context)
        if request.input.text == "forwarded?":
            seen = any(k == "mstar-forwarded" for k, _ in context.invocation_metadata())
            return ipb.GenerateResponse(request_id="req-1", text=f"{self.name}:{seen}")
        text = []
        async for event in fake_run(request.input, context):
            if event.HasField("chunk"):
                text.append(event.chunk.text)
        return ipb.GenerateResponse(request_id="req-1", text="".join(text))

    async def ListModels(self, request, context):
        await self._maybe_refuse(context)
        return ipb.ListModelsResponse(object="list", data=[ipb.Model(id=self.name, object="model", owned_by="mstar")])

    async def Cancel(self, request, context):
        return ipb.CancelResponse(request_id=request.request_id, cancelled=False)

    async def CreateChatCompletion(self, request, context):
        async for body in openai.chat_completions(request, context, fake_run, model_name="fake"):
            yield body

    async def CreateCompletion(self, request, context):
        async for body in openai.completions(request, context, fake_run, model_name="fake"):
            yield body


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
