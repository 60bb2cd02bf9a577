"""The ONE multiplexed GenerationService stream to one generation replica (the replica pool,
services/preprocess/replica_pool.py, keeps one per replica).

One task owns the connection: connect, check grpc.health.v1, open `Stream`, then read frames and
route every ResultTokens row / terminal frame to the request it belongs to (one bounded
asyncio.Queue per request). Outgoing frames from all requests go through one queue and are
batched into as few StreamRequest frames as the loop allows.

If the stream breaks (process killed, GOAWAY, network), every request in flight is `lost` at
once: re-submitted to another replica by the replica pool when no token came back yet (the
contract's retry rule), else BackendFailed(UNAVAILABLE). The backend reports unhealthy (new
requests get UNAVAILABLE from `attach`) and the task reconnects with exponential backoff. A
health Watch on the same channel turns the backend unhealthy when the generation service reports
NOT_SERVING (draining, engine failure) even while the stream is still up.

A generation process that stops without closing anything (SIGSTOP, a frozen host, a partition)
breaks no connection and reports nothing. The stream asks for a ConductorStatus every
`heartbeat_s`; when nothing at all arrives for `stall_s`, the backend is *stalled*
(BACKEND_STALLED) until the next frame: it takes no new requests (they go to another replica or
are refused, UNAVAILABLE with a retry delay), and its requests in flight are `stalled`: those the
retry rule lets move now (no token yet, another replica serving) move, the others wait, since a
frozen process usually resumes and then finishes them. A request's deadline still ends it. A
stream silent for `dead_s` is given up like a broken one (reconnect; its requests are lost as
above), so a request without a deadline never waits for a process that never resumes.

Health changes go to `on_health`: the replica pool, which reports the process's dependency
"generation" (services/common/serving.py) for all replicas together.

Internal request keys are short counters ("r1f"), unique per backend, so an id reused right
after an abort can never receive the old request's late frames, and every engine-step frame,
which repeats the key of every running row, stays small whatever ids clients choose. The public
request id travels as the internal PreprocessInput's client_request_id, for the logs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import messages_pb2 as pb

from services.common import hop_trace
from services.common.errors import Code, FieldViolation, MstarError, from_code, unavailable
from services.common.pixel_normalization import TILE_MIME_TYPE
from services.common.server import INTERNAL_MAX_MESSAGE_BYTES, channel_options
from services.preprocess import wire
from services.preprocess.backend_events import (
    BackendFailed,
    Heartbeat,
    TensorResult,
    TokenStep,
    finished_event,
)
from services.preprocess.backend_request import BackendRequest
from services.preprocess.request import TokenLogprobs

log = logging.getLogger(__name__)


class GenerationBackend:
    def __init__(
        self,
        target: str,
        *,
        queue_size: int = 1024,
        connect_timeout_s: float = 2.0,
        max_backoff_s: float = 2.0,
        on_health: Callable[[bool], None] | None = None,
        on_status: Callable[[gen_pb2.ConductorStatus], None] | None = None,
        heartbeat_s: float = 0.5,
        stall_s: float = 5.0,
        dead_s: float = 60.0,
    ) -> None:
        self.target = target
        self._queue_size = queue_size
        self._connect_timeout_s = connect_timeout_s
        self._max_backoff_s = max_backoff_s
        self._on_health = on_health
        self._on_status = on_status
        self._heartbeat_s = heartbeat_s
        self._stall_s = stall_s
        self._dead_s = max(dead_s, stall_s)
        self._status_metadata = (("mstar-status-interval-ms", str(max(1, round(heartbeat_s * 1000)))),)
        self._requests: dict[str, BackendRequest] = {}
        self._outbox: asyncio.Queue[gen_pb2.ClientFrame | None] | None = None
        self._counter = itertools.count()
        # Healthy = the stream is up, the generation service says SERVING, and it is not silent.
        self._connected = False
        self._remote_serving = False
        self._silent = False
        self._healthy = False
        self._last_frame = 0.0
        # How the backend computes, from its Stream's initial metadata (generation servicer's
        # NUMERICS_KEY, JSON); {} until a stream has opened. Reported by ListModels.
        self.numerics: dict = {}
        self._task: asyncio.Task | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self._report_health()

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="generation-backend")

    async def close(self) -> None:
        self._closing = True
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_all(unavailable("preprocess service shutting down"))

    def attach(self, request: BackendRequest) -> None:
        """Run `request` on this stream under a fresh key: its first attempt, or a failover from
        another replica (with every prompt token so far). UNAVAILABLE while the backend is down.
        (services/preprocess/replica_pool.py decides which backend; requests start there.)"""
        if not self._healthy or self._outbox is None:
            raise unavailable(f"generation backend {self.target} is unavailable")
        key = f"r{next(self._counter):x}"
        request.backend, request.key = self, key
        request.tried.append(self.target)
        self._requests[key] = request
        if hop_trace.ON:  # bench/hops.py joins this stream key to the public request id
            hop_trace.mark("alias", key, 0, request.request_id)
        start = pb.PreprocessInput(
            request_id=key,
            client_request_id=request.request_id,
            prompt_parts=[pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=request.prompt_ids)),
                          *(pb.PromptPart(modality=pb.MODALITY_IMAGE, data=tile, mime_type=TILE_MIME_TYPE)
                            for tile in request.image_tiles)],
            input_modalities=[pb.MODALITY_TOKENS] if request.input_open else [],
            output_modalities=[pb.MODALITY_EMBEDDING if request.model_kwargs.HasField("embedding")
                               else pb.MODALITY_TOKENS],
            model_kwargs=request.model_kwargs,
            trace_context=request.trace_context,
        )
        self.send(gen_pb2.ClientFrame(preprocess_input=start))

    # ---- connection

    def send(self, frame: gen_pb2.ClientFrame) -> None:
        """Queue a frame for the stream; dropped while no stream is up (its requests are lost then)."""
        if self._outbox is not None:
            self._outbox.put_nowait(frame)

    def is_running(self, key: str) -> bool:
        """Whether the request under `key` still runs on this stream (no terminal frame yet)."""
        return key in self._requests

    def forget(self, key: str) -> bool:
        """Stop routing frames to `key` (its later frames are dropped); False if it was not running."""
        return self._requests.pop(key, None) is not None

    def _report_health(self) -> None:
        if not self._connected:
            reason, why = "BACKEND_UNAVAILABLE", f"generation backend {self.target} is unavailable"
        elif not self._remote_serving:
            reason, why = "BACKEND_NOT_SERVING", f"generation backend {self.target} is not serving"
        elif self._silent:
            reason, why = "BACKEND_STALLED", f"generation backend {self.target} sent nothing for {self._stall_s:g} s"
        else:
            reason, why = "", ""
        healthy = not reason
        changed = healthy != self._healthy
        if changed:
            log.log(logging.INFO if healthy else logging.WARNING, "generation backend health",
                    extra={"target": self.target, "healthy": healthy, "reason": reason})
        self._healthy = healthy
        self.unhealthy_reason = (reason, why)
        if changed and self._on_health is not None:
            self._on_health(healthy)

    def _set(self, **flags: bool) -> None:
        for name, value in flags.items():
            setattr(self, "_" + name, value)
        self._report_health()

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closing:
            channel = grpc.aio.insecure_channel(self.target, options=channel_options(INTERNAL_MAX_MESSAGE_BYTES))
            tasks: list[asyncio.Task] = []
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    await channel.channel_ready()
                health = health_pb2_grpc.HealthStub(channel)
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=self._connect_timeout_s
                )
                if reply.status != health_pb2.HealthCheckResponse.SERVING:
                    raise ConnectionError("generation backend is not serving yet")
                outbox: asyncio.Queue[gen_pb2.ClientFrame | None] = asyncio.Queue()
                self._outbox = outbox
                call = gen_grpc.GenerationServiceStub(channel).Stream(_frames(outbox), metadata=self._status_metadata)
                loop = asyncio.get_running_loop()
                self._last_frame = loop.time()
                # Silent for dead_s: given up like a broken stream (TimeoutError), whatever keepalive
                # makes of it (a stopped process's kernel keeps the connection up: a 40 s SIGSTOP
                # broke nothing).
                async with asyncio.timeout_at(self._last_frame + self._dead_s) as silence:
                    self.numerics = wire.numerics_of(await call.initial_metadata())
                    tasks = [asyncio.create_task(self._watch(health)), asyncio.create_task(self._watch_silence())]
                    self._set(connected=True, remote_serving=True, silent=False)
                    self.connected.set()
                    backoff = 0.05
                    async for response in call:
                        self._last_frame = now = loop.time()
                        if silence.when() - now < self._dead_s - min(1.0, self._dead_s / 10):  # cheap: seldom
                            silence.reschedule(now + self._dead_s)
                        if self._silent:
                            log.info("generation backend speaks again", extra={"target": self.target})
                            self._set(silent=False)
                        self._dispatch(response)
                log.warning("generation stream ended by the server", extra={"target": self.target})
            except (grpc.RpcError, TimeoutError, ConnectionError, OSError) as exc:
                if isinstance(exc, TimeoutError) and self._connected:
                    log.error("generation backend silent too long: giving its stream up",
                              extra={"target": self.target, "silent_s": self._dead_s})
                else:
                    log.warning("generation backend connection failed",
                                extra={"target": self.target, "error": repr(exc)})
            finally:
                self._outbox = None
                self.connected.clear()
                self._set(connected=False)
                self._fail_all(unavailable(f"generation backend {self.target} connection lost"))
                for task in tasks:
                    task.cancel()
                await channel.close(grace=None)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    async def _watch(self, health: health_pb2_grpc.HealthStub) -> None:
        """Follow the backend's own health while the stream is up (draining, engine failure)."""
        try:
            async for reply in health.Watch(health_pb2.HealthCheckRequest(service="")):
                self._set(remote_serving=reply.status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.RpcError:
            return  # the stream task notices the broken connection itself

    async def _watch_silence(self) -> None:
        """A stream that stays up but carries nothing (not even the heartbeat status) for stall_s
        belongs to a frozen process: shed new work at once, and let its requests move elsewhere
        (if they may) or wait for it to resume (the module docstring)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self._heartbeat_s, self._stall_s / 4))
            silent_for = loop.time() - self._last_frame
            if silent_for > self._stall_s and not self._silent:
                log.error("generation backend silent: no new requests until it speaks again",
                          extra={"target": self.target, "silent_s": round(silent_for, 3),
                                 "requests": len(self._requests)})
                self._set(silent=True)
                error = unavailable(f"the generation service sent nothing for {silent_for:.1f} s",
                                    reason="BACKEND_STALLED")
                for request in list(self._requests.values()):
                    request.stalled(error)

    def _fail_all(self, error: MstarError) -> None:
        requests, self._requests = self._requests, {}
        for request in requests.values():
            request.lost(error)

    def _dispatch(self, response: gen_pb2.StreamResponse) -> None:
        for frame in response.frames:
            kind = frame.WhichOneof("frame")
            if kind == "result_tokens":
                self._dispatch_tokens(frame.result_tokens)
            elif kind == "request_complete":
                done = frame.request_complete
                request = self._requests.pop(done.request_id, None)
                if request is not None:
                    request.deliver(finished_event(done))
            elif kind == "result_tensors":
                result = frame.result_tensors
                request = self._requests.get(result.request_id)
                if request is not None:
                    request.deliver(TensorResult(result.tensor.data, tuple(result.tensor.shape)))
            elif kind == "conductor_status":
                if self._on_status is not None:
                    self._on_status(frame.conductor_status)
            elif kind == "request_failed":
                failed = frame.request_failed
                request = self._requests.pop(failed.request_id, None)
                if request is not None:
                    code = from_code(failed.code)  # an unset code is INTERNAL, never OK
                    reason = failed.reason or code.name
                    message = _public_message(failed.message, failed.request_id, request.request_id)
                    about = message.removeprefix(f"{failed.field}: ")
                    violations = [FieldViolation(failed.field, about)] if failed.field else []
                    error = MstarError(code, reason, message or reason, violations,
                                       metadata={"field": failed.field} if failed.field else {})
                    if code == Code.UNAVAILABLE:  # draining or failed engine: retryable elsewhere
                        request.lost(error)
                    else:
                        request.deliver(BackendFailed(error))

    def _dispatch_tokens(self, frame: gen_pb2.ResultTokens) -> None:
        heartbeat = frame.signal == gen_pb2.SIGNAL_HEARTBEAT
        with_logprobs = len(frame.logprobs) == len(frame.request_ids)
        for i, key in enumerate(frame.request_ids):
            request = self._requests.get(key)
            if request is None:
                continue  # aborted or unknown: late frames are dropped
            if heartbeat:
                request.deliver(Heartbeat())
                continue
            lp = None
            if with_logprobs and (entry := frame.logprobs[i]).ByteSize():
                lp = TokenLogprobs(entry.logprob, tuple(entry.top_token_ids), tuple(entry.top_logprobs))
            request.deliver(TokenStep(frame.token_ids[i], lp))
            if hop_trace.ON:
                hop_trace.mark("pp_recv", key, frame.loop_indices[i] if i < len(frame.loop_indices) else -1)


def _public_message(message: str, key: str, request_id: str) -> str:
    """The engine's message with the request named by its public id: the generation side names
    it by our stream key, as its id on the internal contract ('r1f') or as the engine's own key
    ((stream, 'r1f')), neither of which the client ever saw."""
    return re.sub(rf"\(\d+, '{re.escape(key)}'\)|'{re.escape(key)}'", lambda _: f"'{request_id}'", message)


# One StreamRequest carries at most this many frames / about this many bytes: whatever piled up
# is batched, but a burst must never build a message near the 16 MB limit (that would break the
# stream every request shares) or beyond the contract's frame count.
_MAX_BATCH_FRAMES = 1024
_MAX_BATCH_BYTES = 1 << 20


async def _frames(outbox: asyncio.Queue[gen_pb2.ClientFrame | None]):
    """Client side of the stream: what was queued since the last message goes in one message."""
    while True:
        first = await outbox.get()
        if first is None:
            return
        batch, size = [first], first.ByteSize()
        while not outbox.empty() and len(batch) < _MAX_BATCH_FRAMES and size < _MAX_BATCH_BYTES:
            item = outbox.get_nowait()
            if item is None:
                yield gen_pb2.StreamRequest(frames=batch)
                return
            batch.append(item)
            size += item.ByteSize()
        yield gen_pb2.StreamRequest(frames=batch)
