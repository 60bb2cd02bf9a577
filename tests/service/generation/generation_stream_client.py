"""A blocking client for GenerationService.Stream: send frames, collect per-request results."""

from __future__ import annotations

import queue
import threading

import grpc
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import messages_pb2 as pb

_DONE = object()


def start(request_id, prompt, max_tokens=8, input_open=False, **sampling) -> gen_pb2.ClientFrame:
    params = pb.SamplingParams(max_tokens=max_tokens, **({"temperature": 0.0} | sampling))
    return gen_pb2.ClientFrame(preprocess_input=pb.PreprocessInput(
        request_id=request_id,
        prompt_parts=[pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=prompt))],
        input_modalities=[pb.MODALITY_TOKENS] if input_open else [],
        model_kwargs=pb.ModelKwargs(sampling=params),
    ))


def append(request_id, ids, end=True) -> gen_pb2.ClientFrame:
    return gen_pb2.ClientFrame(client_append=pb.ClientAppend(
        request_id=request_id, chunks=[pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=ids))],
        ends=[pb.MODALITY_TOKENS] if end else []))


def abort(request_id) -> gen_pb2.ClientFrame:
    return gen_pb2.ClientFrame(abort=gen_pb2.Abort(request_id=request_id))


class StreamClient:
    def __init__(self, port: int, metadata=()):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._outbox: queue.Queue = queue.Queue()
        self.call = gen_grpc.GenerationServiceStub(self.channel).Stream(self._requests(), metadata=metadata)
        self.responses: list[gen_pb2.StreamResponse] = []
        self.tokens: dict[str, list[int]] = {}
        self.ends: dict[str, gen_pb2.ServerFrame] = {}
        self.heartbeats: dict[str, int] = {}
        self.statuses: list[gen_pb2.ConductorStatus] = []
        self.error: grpc.RpcError | None = None
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _requests(self):
        while True:
            item = self._outbox.get()
            if item is _DONE:
                return
            yield gen_pb2.StreamRequest(frames=item)

    def send(self, *frames: gen_pb2.ClientFrame) -> None:
        self._outbox.put(list(frames))

    def half_close(self) -> None:
        self._outbox.put(_DONE)

    def cancel(self) -> None:
        self.call.cancel()

    def _read(self) -> None:
        try:
            for response in self.call:
                with self._changed:
                    self.responses.append(response)
                    for env in response.frames:
                        kind = env.WhichOneof("frame")
                        if kind == "result_tokens" and env.result_tokens.signal == gen_pb2.SIGNAL_HEARTBEAT:
                            for rid in env.result_tokens.request_ids:
                                assert rid not in self.ends, f"heartbeat after the terminal event of {rid}"
                                self.heartbeats[rid] = self.heartbeats.get(rid, 0) + 1
                        elif kind == "result_tokens":
                            frame = env.result_tokens
                            for rid, tok in zip(frame.request_ids, frame.token_ids, strict=True):
                                assert rid not in self.ends, f"token after the terminal event of {rid}"
                                self.tokens.setdefault(rid, []).append(tok)
                        elif kind in ("request_complete", "request_failed"):
                            rid = getattr(env, kind).request_id
                            assert rid not in self.ends, f"second terminal event for {rid}"
                            self.ends[rid] = env
                        elif kind == "conductor_status":
                            self.statuses.append(env.conductor_status)
                    self._changed.notify_all()
        except grpc.RpcError as e:
            self.error = e
        with self._changed:
            self._changed.notify_all()

    def wait(self, predicate, timeout: float = 30.0) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def wait_ended(self, request_ids, timeout: float = 60.0) -> bool:
        return self.wait(lambda c: all(r in c.ends for r in request_ids), timeout)

    def latest_metric(self, name: str) -> float | None:
        for status in reversed(self.statuses):
            for m in status.metrics:
                if m.name == name:
                    return m.value
        return None

    def close(self) -> None:
        self.half_close()
        self._reader.join(10)
        self.channel.close()
