"""Streaming clients the load generator drives. Each `request(prompt, max_tokens)` returns a
Record with a timestamp per token-bearing message. Greedy, ignore-eos, fixed max_tokens: every
peer produces exactly the same number of tokens per request.

- GrpcClient: mstar's public InferenceService.GenerateStream over gRPC (also the bare ceiling
  server, which speaks the same RPC).
- OpenAISSEClient: OpenAI /v1/completions with stream=true (SSE) over HTTP with httpx: mstar
  through Envoy, and llama.cpp's llama-server, with the same code path and the same body.
"""

from __future__ import annotations

import json
import time

import grpc
import httpx
from mstar.v1 import inference_service_pb2 as isvc
from mstar.v1 import inference_service_pb2_grpc as isvc_grpc
from mstar.v1 import messages_pb2 as msg

from bench.stats import Record


class GrpcClient:
    name = "grpc"

    def __init__(self, target: str, channels: int = 1) -> None:
        # One HTTP/2 connection carries every stream, as a real gRPC client would do.
        self.channels = [grpc.aio.insecure_channel(target) for _ in range(channels)]
        self.stubs = [isvc_grpc.InferenceServiceStub(c) for c in self.channels]
        self._next = 0

    async def request(self, prompt: str, max_tokens: int) -> Record:
        stub = self.stubs[self._next % len(self.stubs)]
        self._next += 1
        sampling = msg.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        req = isvc.GenerateStreamRequest(
            input=msg.PreprocessInput(text=prompt, model_kwargs=msg.ModelKwargs(sampling=sampling))
        )
        rec = Record(start=time.perf_counter())
        try:
            async for ev in stub.GenerateStream(req):
                kind = ev.WhichOneof("event")
                if kind == "chunk":
                    n = len(ev.chunk.token_ids) or (1 if ev.chunk.text else 0)
                    rec.on_tokens(time.perf_counter(), n)
                elif kind == "failed":
                    rec.error = f"failed: {ev.failed.reason or ev.failed.message}"
                elif kind == "complete" and ev.complete.usage.completion_tokens:
                    rec.tokens = ev.complete.usage.completion_tokens
        except grpc.aio.AioRpcError as e:
            rec.error = f"{e.code().name}: {e.details()}"
        rec.end = time.perf_counter()
        return rec

    async def aclose(self) -> None:
        for c in self.channels:
            await c.close()


class OpenAISSEClient:
    name = "http"

    def __init__(self, base_url: str, model: str = "default", concurrency: int = 64) -> None:
        limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
        self.http = httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(600.0))
        self.model = model

    async def request(self, prompt: str, max_tokens: int) -> Record:
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }
        rec = Record(start=time.perf_counter())
        usage_tokens = None
        try:
            async with self.http.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                    rec.end = time.perf_counter()
                    return rec
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        rec.error = f"in-band error: {obj['error']}"
                        continue
                    choices = obj.get("choices") or []
                    if choices and choices[0].get("text"):
                        rec.on_tokens(time.perf_counter(), 1)
                    if obj.get("usage"):
                        usage_tokens = obj["usage"].get("completion_tokens")
        except httpx.HTTPError as e:
            rec.error = f"{type(e).__name__}: {e}"
        # Count tokens, not chunks: a detokenizer may hold bytes back and merge two tokens.
        if usage_tokens:
            rec.tokens = usage_tokens
        rec.end = time.perf_counter()
        return rec

    async def aclose(self) -> None:
        await self.http.aclose()
