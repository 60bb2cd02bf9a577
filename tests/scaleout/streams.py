"""Client helpers for the scale-out suite: gRPC streams through Envoy that a test can hold open,
and prompts whose rendezvous choice is a chosen replica."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from services.preprocess import routing


def tokens(ids: list[int]) -> pb.PromptPart:
    return pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=ids))


@dataclass
class Stream:
    """One GenerateStream consumed on a thread: every event kept, the terminal one flagged."""

    request_id: str
    events: list = field(default_factory=list)
    error: grpc.RpcError | None = None
    done: threading.Event = field(default_factory=threading.Event)
    accepted: threading.Event = field(default_factory=threading.Event)

    @property
    def chunks(self) -> int:
        return sum(e.HasField("chunk") for e in self.events)

    @property
    def terminal(self):
        return self.events[-1] if self.events and self.events[-1].WhichOneof("event") in ("complete", "failed") else None

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)


def start_stream(target: str, ids: list[int], *, max_tokens: int, request_id: str = "",
                 open_input: bool = False, timeout_s: float = 120) -> Stream:
    start = pb.PreprocessInput(
        request_id=request_id, prompt_parts=[tokens(ids)],
        input_modalities=[pb.MODALITY_TOKENS] if open_input else [],
        model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)))
    stream = Stream(request_id)

    def consume() -> None:
        with grpc.insecure_channel(target) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            try:
                for event in stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=timeout_s):
                    if event.HasField("accepted"):
                        stream.request_id = event.accepted.request_id
                        stream.accepted.set()
                    stream.events.append(event)
            except grpc.RpcError as err:
                stream.error = err
            finally:
                stream.accepted.set()
                stream.done.set()

    threading.Thread(target=consume, daemon=True).start()
    return stream


def append(target: str, request_id: str, ids: list[int], end: bool) -> api.AppendResponse:
    message = pb.ClientAppend(request_id=request_id, chunks=[tokens(ids)], ends=[pb.MODALITY_TOKENS] if end else [])
    with grpc.insecure_channel(target) as channel:
        return api_grpc.InferenceServiceStub(channel).Append(api.AppendRequest(append=message), timeout=10)


def cancel(target: str, request_id: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        stub = api_grpc.InferenceServiceStub(channel)
        return stub.Cancel(api.CancelRequest(request_id=request_id), timeout=10).cancelled


def prompts_homed_on(address: str, addresses: list[str], count: int, blocks: int = 6, start: int = 0) -> list[list[int]]:
    """`count` distinct prompts whose affinity key's first rendezvous choice (routing.py, default
    config) among `addresses` is `address`: where an idle pool sends them."""
    config = routing.RoutingConfig()
    found, tag = [], start
    while len(found) < count:
        ids = [1000 + (tag * 131 + i) % 40000 for i in range(blocks * config.block_size)]
        if routing.rank(routing.affinity_key(ids, config), addresses)[0] == address:
            found.append(ids)
        tag += 1
    return found


def wait_all(streams: list[Stream], timeout_s: float) -> list[Stream]:
    """The streams still open after timeout_s (none, if nothing hangs)."""
    deadline = time.monotonic() + timeout_s
    for s in streams:
        s.wait(max(0.0, deadline - time.monotonic()))
    return [s for s in streams if not s.done.is_set()]
