"""Test harness of the surface tests (conftest.py holds their fixtures): a whole preprocess domain
in-process, without gRPC: the real RequestRunner, RequestRun,
tokenizer and chat template of the default model, in front of an echo engine that "generates"
each request's own prompt tokens back (honouring max_tokens), so surface endpoints can be run
end to end in a unit test and their output predicted exactly."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

from mstar.v1 import messages_pb2 as pb

from services.common.errors import Code, MstarError
from services.common.finish import FinishReason
from services.common.serving import ServingState
from services.preprocess.admission import Admission, AdmissionLimits
from services.preprocess.backend import GenerationBackend
from services.preprocess.backend_events import BackendFailed, BackendFinished, TensorResult, TokenStep
from services.preprocess.backend_request import BackendRequest
from services.preprocess.limits import Limits
from services.preprocess.media import FileReader
from services.preprocess.request import TokenLogprobs
from services.preprocess.request_run import Deps
from services.preprocess.runner import RequestRunner
from services.preprocess.surfaces.http import HttpRequest
from services.preprocess.wire import embedding_kwargs, engine_kwargs


class EchoBackend(GenerationBackend):
    """Never connects; every submitted request gets its prompt tokens back, one per step. Stands
    for the replica pool too (`submit`: one replica, every request starts on it). An embedding
    request gets echo_embedding(its prompt) after one step."""

    def __init__(self, step_s: float = 0.0, hold: bool = False, fail_after: int | None = None) -> None:
        super().__init__("echo")
        self._healthy = True
        self._outbox = asyncio.Queue()  # never read: send is the engine
        self.step_s = step_s
        self.hold = hold  # True: requests never finish (until aborted)
        self.fail_after = fail_after  # tokens before the request fails UNAVAILABLE (engine lost)
        self.started: list[str] = []
        self.sampling: list = []  # each started request's mstar.v1.SamplingParams, as sent
        self.aborted: list[str] = []
        self.in_flight = self.most_in_flight = 0  # embedding requests
        self.fail_embedding_of_len = -1  # an embedding of a prompt this long fails UNAVAILABLE

    def submit(self, request_id: str, prompt_ids: list[int], sampling, max_tokens: int,
               input_open: bool, embedding=None, image_tiles=()) -> BackendRequest:
        kwargs = embedding_kwargs(embedding) if embedding else engine_kwargs(sampling, max_tokens)
        request = BackendRequest(request_id, prompt_ids, kwargs, input_open, 1024, image_tiles)
        self.attach(request)
        return request

    def send(self, envelope) -> None:
        kind = envelope.WhichOneof("frame")
        if kind == "preprocess_input":
            msg = envelope.preprocess_input
            ids = [i for p in msg.prompt_parts for i in p.token_ids.ids]
            self.started.append(msg.request_id)
            self.sampling.append(msg.model_kwargs.sampling)
            if pb.MODALITY_EMBEDDING in msg.output_modalities:
                e = msg.model_kwargs.embedding
                width = e.dimensions if e.HasField("dimensions") else ECHO_WIDTH
                asyncio.get_running_loop().create_task(self._embed(msg.request_id, ids, width))
                return
            asyncio.get_running_loop().create_task(self._echo(msg.request_id, ids, msg.model_kwargs.sampling))
        elif kind == "abort":
            self.aborted.append(envelope.abort.request_id)

    async def _embed(self, key: str, ids: list[int], width: int) -> None:
        request = self._requests.get(key)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.step_s)
            if request.ended:
                return
            if len(ids) == self.fail_embedding_of_len:
                request.deliver(BackendFailed(MstarError(Code.UNAVAILABLE, "BACKEND_UNAVAILABLE", "engine lost")))
                return
            request.deliver(TensorResult(echo_embedding(ids, width), (width,)))
            request.deliver(BackendFinished(FinishReason.END))
        finally:
            self.in_flight -= 1

    async def _echo(self, key: str, ids: list[int], sampling) -> None:
        request = self._requests.get(key)
        limit = sampling.max_tokens
        stop_ids = set(sampling.stop_token_ids)
        out = 0
        for token in ids:
            await asyncio.sleep(self.step_s)
            if request.ended:
                return
            if out == self.fail_after:
                request.deliver(BackendFailed(MstarError(Code.UNAVAILABLE, "BACKEND_UNAVAILABLE", "engine lost")))
                return
            lp = None
            if sampling.HasField("logprobs"):  # the token's own id is its best alternative
                lp = TokenLogprobs(-0.5, (token, 0)[: sampling.logprobs], (-0.5, -2.0)[: sampling.logprobs])
            request.deliver(TokenStep(token, lp))
            out += 1
            if token in stop_ids:
                request.deliver(BackendFinished(FinishReason.END, cached_prompt_tokens=1, completion_tokens=out))
                return
            if out >= limit:
                request.deliver(BackendFinished(FinishReason.LENGTH, cached_prompt_tokens=1, completion_tokens=out))
                return
        while self.hold and not request.ended:
            await asyncio.sleep(0.01)
        request.deliver(BackendFinished(FinishReason.END, cached_prompt_tokens=1, completion_tokens=out))


ECHO_WIDTH = 8


def echo_embedding(ids: list[int], width: int) -> bytes:
    """The echo engine's "embedding": the unit vector along axis len(ids) % width, float32 LE."""
    values = [0.0] * width
    values[len(ids) % width] = 1.0
    return struct.pack(f"<{width}f", *values)


def serving() -> ServingState:
    state = ServingState("preprocess")
    state.serve()
    return state


def make_runner(model, backend: EchoBackend | None = None, **admission) -> RequestRunner:
    limits = AdmissionLimits(**admission)
    deps = Deps(model=model, backend=backend or EchoBackend(), admission=Admission(limits), limits=Limits(),
                files=FileReader(None, 1024), keepalive_s=30.0)
    return RequestRunner(deps, serving())


def http(body, **headers) -> HttpRequest:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HttpRequest(body=data, content_type="application/json", headers=headers)


def collect(endpoint, req: HttpRequest, runner: RequestRunner, *args) -> list:
    """Every frame an endpoint yields (raises what it raises before/after them)."""

    async def go():
        scope = runner.scope()
        try:
            return [frame async for frame in endpoint(req, scope, *args)]
        finally:
            scope.close()

    return asyncio.run(go())


def sse_events(frames) -> list[tuple[str | None, dict | str]]:
    """(event name, parsed data) per SSE event; comments as (":", text)."""
    text = b"".join(f.data for f in frames).decode()
    out = []
    for block in text.split("\n\n")[:-1]:
        if block.startswith(":"):
            out.append((":", block))
            continue
        name, data = None, ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


GOLDEN = Path(__file__).parent / "golden"
