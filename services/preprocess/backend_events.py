"""What a BackendRequest's queue yields: the generation side's events for one request, already
out of protobuf (the runner and the surfaces above it never see a generation frame)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mstar.v1 import messages_pb2 as pb

from services.common.errors import MstarError
from services.common.finish import FinishReason
from services.common.finish_wire import finish_reason_of
from services.preprocess.request import TokenLogprobs


@dataclass(frozen=True)
class TokenStep:
    token_id: int
    logprobs: TokenLogprobs | None = None


@dataclass(frozen=True)
class TensorResult:
    """An embedding request's vector (ResultTensors): float32 little-endian bytes."""

    data: bytes
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Heartbeat:
    """The engine is alive and still working on this request (long prefill)."""


@dataclass(frozen=True)
class BackendFinished:
    finish_reason: FinishReason
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    conductor_times: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendFailed:
    error: MstarError


BackendEvent = TokenStep | TensorResult | Heartbeat | BackendFinished | BackendFailed


def finished_event(done: pb.RequestComplete) -> BackendFinished:
    t = done.timings
    timings = {
        "queue_ms": t.queue_ms,
        "prefill_ms": t.prefill_ms,
        "time_to_first_token_ms": t.time_to_first_token_ms,
        "decode_ms": t.decode_ms,
        "e2e_ms": t.e2e_ms,
        "preempted_ms": t.preempted_ms,
    }
    times = {
        name: getattr(done, name).ToMicroseconds() / 1e6
        for name in ("conductor_arrival_time", "conductor_ingest_time", "conductor_finish_time")
        if done.HasField(name)
    }
    return BackendFinished(
        finish_reason=finish_reason_of(done.finish_reason),
        cached_prompt_tokens=done.usage.cached_prompt_tokens,
        completion_tokens=done.usage.completion_tokens,
        timings_ms=timings,
        conductor_times=times,
    )
