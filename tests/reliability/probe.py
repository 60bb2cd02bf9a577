"""Client-side probes for the reliability suite: KV/engine state, health, a canary request, and
collectors that count terminal events. Every loop here is bounded by a deadline.

The generation service's state is read the way the contract exposes it: a GenerationService.Stream
opened with `mstar-status-interval-ms` metadata delivers ConductorStatus snapshots
(kv_blocks_used, requests_running, requests_waiting, ...), so no test reaches into a process.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Each probe channel gets its own connection: gRPC otherwise shares one per address across the
# process, and one that saw a killed server keeps failing fast during its reconnect backoff.
FRESH = (("grpc.use_local_subchannel_pool", 1),)


def sampling(max_tokens: int = 8, **kw) -> pb.ModelKwargs:
    return pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=max_tokens, **kw))


def text_input(text: str = "Count from one to twenty:", max_tokens: int = 8, **kw) -> pb.PreprocessInput:
    """A plain-text request; temperature 0 by default so outputs are comparable."""
    kw.setdefault("temperature", 0.0)
    return pb.PreprocessInput(text=text, model_kwargs=sampling(max_tokens, **kw))


async def conductor_status(gen_addr: str, timeout_s: float = 5.0) -> dict[str, float]:
    """One ConductorStatus snapshot from the generation service, as {metric name: value}."""
    async def hold_open():  # a half-close would end the stream before the first status
        yield gen_pb2.StreamRequest()
        await asyncio.sleep(timeout_s)

    async with grpc.aio.insecure_channel(gen_addr, options=FRESH) as channel:
        stub = gen_grpc.GenerationServiceStub(channel)
        call = stub.Stream(hold_open(), metadata=(("mstar-status-interval-ms", "50"),), timeout=timeout_s)
        try:
            async for response in call:
                for env in response.frames:
                    if env.WhichOneof("frame") == "conductor_status":
                        return {m.name: m.value for m in env.conductor_status.metrics}
        finally:
            call.cancel()
    raise AssertionError("generation stream ended without a ConductorStatus")


async def wait_engine_idle(gen_addr: str, kv_baseline: float = 0.0, timeout_s: float = 10.0) -> dict[str, float]:
    """Poll until nothing runs or waits and kv_blocks_used is back to the baseline; return the
    last snapshot. Fails with the last snapshot when the deadline passes (a KV leak)."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, float] = {}
    while time.monotonic() < deadline:
        status = await conductor_status(gen_addr)
        busy = status.get("requests_running", 0) + status.get("requests_waiting", 0)
        if busy == 0 and status.get("kv_blocks_used", 0) <= kv_baseline:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"engine not back to idle baseline {kv_baseline} within {timeout_s}s: {status}")


async def health(addr: str, service: str = "", timeout_s: float = 2.0) -> int:
    async with grpc.aio.insecure_channel(addr, options=FRESH) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        return reply.status


async def wait_health(addr: str, want: int, timeout_s: float = 10.0) -> float:
    """Seconds until health reads `want` (UNAVAILABLE connections count as not yet)."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < timeout_s:
        try:
            last = await health(addr)
            if last == want:
                return time.monotonic() - start
        except grpc.RpcError as e:
            last = e.code()
        await asyncio.sleep(0.05)
    raise AssertionError(f"health of {addr} is {last}, wanted {want} within {timeout_s}s")


async def canary(api_addr: str, timeout_s: float = 60.0) -> api.GenerateResponse:
    """The engine still serves a new request after a fault (the after-every-case check)."""
    async with grpc.aio.insecure_channel(api_addr) as channel:
        stub = api_grpc.InferenceServiceStub(channel)
        reply = await stub.Generate(api.GenerateRequest(input=text_input("Hello", max_tokens=2)), timeout=timeout_s)
    assert reply.complete.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH), reply
    return reply


async def wait_canary(api_addr: str, timeout_s: float = 20.0) -> float:
    """Seconds until a canary request succeeds (retrying UNAVAILABLE only), bounded."""
    start = time.monotonic()
    while True:
        try:
            await canary(api_addr, timeout_s=10)
            return time.monotonic() - start
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() - start > timeout_s:
                raise
        await asyncio.sleep(0.1)


@dataclass
class StreamRecord:
    """What one GenerateStream/Session request saw: events in order and how the call ended."""

    request_id: str = ""
    events: list[str] = field(default_factory=list)
    text: str = ""
    failed: pb.RequestFailed | None = None
    complete: pb.RequestComplete | None = None
    status: grpc.StatusCode | None = None  # the call's own status when it ended with an error
    error: grpc.RpcError | None = None  # that error, for its rich details (RetryInfo, ErrorInfo)

    @property
    def terminals(self) -> int:
        return self.events.count("complete") + self.events.count("failed")

    def assert_one_terminal(self) -> None:
        """Exactly one terminal event, or (admission refused) a status and no events at all."""
        if self.status is not None and self.status != grpc.StatusCode.OK and not self.events:
            return
        assert self.terminals == 1, f"{self.request_id}: terminal events {self.events[-5:]} status={self.status}"
        assert self.events[-1] in ("complete", "failed"), f"{self.request_id}: events after the terminal"

    def add(self, event_name: str, msg) -> None:
        self.events.append(event_name)
        if event_name == "accepted":
            self.request_id = msg.accepted.request_id
        elif event_name == "chunk":
            self.text += msg.chunk.text
        elif event_name == "complete":
            self.complete = msg.complete
        elif event_name == "failed":
            self.failed = msg.failed


async def collect_stream(call, record: StreamRecord | None = None, stop_after_chunks: int | None = None):
    """Drain a GenerateStream call into a StreamRecord; optionally cancel after k chunks."""
    record = record or StreamRecord()
    try:
        # read() rather than `async for`: callers may have read() the first message already, and
        # grpc.aio forbids mixing the two styles on one call.
        while (msg := await call.read()) is not grpc.aio.EOF:
            record.add(msg.WhichOneof("event"), msg)
            if stop_after_chunks is not None and record.events.count("chunk") >= stop_after_chunks:
                call.cancel()
                break
    except grpc.RpcError as e:
        record.status, record.error = e.code(), e
    except asyncio.CancelledError:
        if not call.cancelled():  # our own task was cancelled: not the call's outcome
            raise
        record.status = grpc.StatusCode.CANCELLED
    return record


async def time_to_idle(gen_addr: str, kv_baseline: float = 0.0, timeout_s: float = 10.0,
                       interval_ms: int = 10) -> float:
    """Seconds from now until a ConductorStatus shows nothing running or waiting and KV at the
    baseline, read from one status stream (precise to ~interval_ms). Used to time aborts."""
    start = time.monotonic()

    async def hold_open():
        yield gen_pb2.StreamRequest()
        await asyncio.sleep(timeout_s)

    async with grpc.aio.insecure_channel(gen_addr) as channel:
        call = gen_grpc.GenerationServiceStub(channel).Stream(
            hold_open(), metadata=(("mstar-status-interval-ms", str(interval_ms)),), timeout=timeout_s)
        last: dict[str, float] = {}
        try:
            async for response in call:
                for env in response.frames:
                    if env.WhichOneof("frame") != "conductor_status":
                        continue
                    last = {m.name: m.value for m in env.conductor_status.metrics}
                    busy = last.get("requests_running", 0) + last.get("requests_waiting", 0)
                    if busy == 0 and last.get("kv_blocks_used", 0) <= kv_baseline:
                        return time.monotonic() - start
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        finally:
            call.cancel()
    raise AssertionError(f"not idle within {timeout_s}s: {last}")


async def wait_running(gen_addr: str, n: int = 1, timeout_s: float = 10.0) -> dict[str, float]:
    """Wait until at least n requests run in the engine (so an abort has something to stop)."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, float] = {}
    while time.monotonic() < deadline:
        status = await conductor_status(gen_addr)
        if status.get("requests_running", 0) >= n:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {n} requests running within {timeout_s}s: {status}")

