"""GenerationService.Stream: many requests multiplexed on one bidirectional stream per client.

Each stream gets an id; engine keys are (stream id, request id), so two streams may use the same
request id. A reader task applies the client's frames in order (engine calls only enqueue).
The engine thread reports each step once; ``_dispatch`` (on the event loop, via
call_soon_threadsafe, several steps per wake-up when the loop is behind) splits it per stream into
that stream's ResultTokens rows (and heartbeat rows for requests that only prefilled) followed by
the same step's RequestComplete / RequestFailed frames, added to the stream's Outbox (outbox.py:
a backlog of steps leaves as one message; a reader that stopped reading ends its stream with
RESOURCE_EXHAUSTED). When a stream ends for any reason, every request still running on it is
aborted (blocks freed within a step).

Every client frame is checked against the contract's declared bounds (services/common/contract.py)
before anything else touches it. A frame that names a valid request id fails only that request;
one that names none (or an out-of-bounds id, which must never be echoed) ends the stream with
INVALID_ARGUMENT, as does an undecodable frame (the interceptor raises it from the iterator).

New streams and new requests are refused with the process's ServingState refusal (UNAVAILABLE
while starting, draining or failed). When the state turns FAILED (the engine crashed, or the
watchdog saw a hung step), every request still running on every stream ends at once with that
error: the engine thread may be stuck, so nothing waits for it.

Each request gets an OpenTelemetry span (`generation.request`, services/common/tracing.py) that
continues the trace its PreprocessInput carries, from arrival to its terminal event.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import re
from dataclasses import dataclass, field

import grpc
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import messages_pb2 as pb
from opentelemetry.trace import Span, StatusCode

from services.common import contract, errors, grpc_errors, hop_trace, tracing
from services.common.fault_boundary import FaultBoundary, RequestFault
from services.common.prompt_fit import check_prompt_fits
from services.common.serving import ServingState, State
from services.generation import wire
from services.generation.outbox import Outbox
from services.generation.outputs import StepOutput

log = logging.getLogger(__name__)

STATUS_INTERVAL_KEY = "mstar-status-interval-ms"
_MAX_FRAMES = contract.bounds(gen_pb2.StreamRequest, "frames").max_items
_ID = contract.bounds(gen_pb2.Abort, "request_id")
_ID_PATTERN = re.compile(_ID.pattern)
_YIELD_EVERY = 64  # client frames applied between two yields to the event loop
# Initial metadata of every Stream: how this backend computes (numerics.Numerics.as_metadata(),
# JSON), so the preprocess service can report it in ListModels without an RPC of its own.
NUMERICS_KEY = "mstar-numerics"


@dataclass
class _Stream:
    stream_id: int
    outbox: Outbox = field(default_factory=Outbox)
    active: set[str] = field(default_factory=set)
    spans: dict[str, Span] = field(default_factory=dict)  # request id -> its generation.request span
    is_half_closed: bool = False


class GenerationServicer(gen_grpc.GenerationServiceServicer):
    def __init__(self, serving: ServingState, status_interval_ms: int = 0, max_queued_frames: int = 10_000,
                 stall_s: float = 30.0):
        self.engine = None  # set once the model is loaded and warm
        self.serving = serving
        self.numerics = ""  # JSON sent as NUMERICS_KEY initial metadata; set with the engine
        self.default_status_interval_ms = status_interval_ms
        self.max_queued_frames = max_queued_frames
        self.stall_s = stall_s
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._steps: collections.deque[StepOutput] = collections.deque()  # engine thread -> loop
        # Building one request's frames fails that request alone; the engine's boundary once attached.
        self.boundary = FaultBoundary("generation", log)
        self._drain_scheduled = False

    # -- engine side --------------------------------------------------------------------------

    def attach(self, engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self._loop = engine, loop
        engine.boundary.inject = engine.boundary.inject or self.boundary.inject
        self.boundary = engine.boundary  # one count of request faults per process (ConductorStatus)
        self.serving.on_change(self._on_serving_change)

    def _on_serving_change(self, state: ServingState) -> None:  # any thread
        if state.state is State.FAILED and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.fail_everything, state.refusal())

    def on_step(self, out: StepOutput) -> None:
        """Engine thread: hand the step to the event loop. Steps that arrive while a drain is
        already scheduled ride along with it: one wake-up of the loop (and one GIL hand-over) per
        batch of steps, not per step, when the engine outruns the loop."""
        self._steps.append(out)  # before reading the flag: a drain that reset it will see this step
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon_threadsafe(self._drain_steps)

    def _drain_steps(self) -> None:
        self._drain_scheduled = False  # before draining: a step appended from now on schedules anew
        while self._steps:
            self._dispatch(self._steps.popleft())

    def _dispatch(self, out: StepOutput) -> None:
        per_stream: dict[int, tuple[list, list, list, list]] = {}
        for row in out.tokens:
            per_stream.setdefault(row.key[0], ([], [], [], []))[0].append(row)
        for key in out.prefilling:
            per_stream.setdefault(key[0], ([], [], [], []))[1].append(key[1])
        for item in out.tensors:
            per_stream.setdefault(item.key[0], ([], [], [], []))[2].append(item)
        for item in out.completed:
            per_stream.setdefault(item.key[0], ([], [], [], []))[3].append((item.key[1], wire.request_complete, item))
        for item in out.failed:
            per_stream.setdefault(item.key[0], ([], [], [], []))[3].append((item.key[1], wire.failure, item))
        for stream_id, (rows, prefilling, tensors, ends) in per_stream.items():
            stream = self._streams.get(stream_id)
            if stream is None:
                continue  # the stream is gone; its requests were aborted
            # Only requests the client still sees as running: one that was already ended here
            # (e.g. a malformed append) must not get a second terminal event.
            rows = [r for r in rows if r.key[1] in stream.active]
            if hop_trace.ON:
                for r in rows:
                    hop_trace.mark("gen_dispatch", r.key[1], r.index, out.step)
            # Each request's part of the frames is its own work: a fault there fails that request
            # alone (services/common/fault_boundary.py), the rest of the step is delivered.
            faults = []
            if any(r.logprobs is not None for r in rows):
                entries = self.boundary.each("output", [r.key for r in rows],
                                             lambda idx, rows=rows: [wire.logprobs_entry(rows[i].logprobs) for i in idx])
                faults = [e for e in entries if isinstance(e, RequestFault)]
                kept = [(r, e) for r, e in zip(rows, entries, strict=True) if not isinstance(e, RequestFault)]
                rows, entries = [r for r, _ in kept], [e for _, e in kept]
            else:
                entries = None
            prefilling = [request_id for request_id in prefilling if request_id in stream.active]
            others = [wire.heartbeat(out.step, prefilling, out.num_batched_tokens)] if prefilling else []
            for t in tensors:
                if t.key[1] in stream.active:
                    frame = self.boundary.call("output", t.key, wire.result_tensors, t)
                    faults.append(frame) if isinstance(frame, RequestFault) else others.append(frame)
            for request_id, to_frame, item in ends:
                if request_id in stream.active and not any(f.key[1] == request_id for f in faults):
                    stream.active.discard(request_id)
                    frame = self.boundary.call("output", item.key, to_frame, item)
                    if isinstance(frame, RequestFault):
                        frame = wire.request_failed(request_id, frame.error)
                    others.append(frame)
                    _end_span(stream.spans.pop(request_id, None), item)
            for fault in faults:  # the request is still running in the engine: end it there too
                if fault.key[1] in stream.active:
                    stream.active.discard(fault.key[1])
                    others.append(wire.request_failed(fault.key[1], fault.error))
                    _end_span(stream.spans.pop(fault.key[1], None), None, fault.error)
                    self.engine.abort(fault.key)
            if not rows and not others:
                continue
            size = sum(len(r.key[1]) + 16 for r in rows) + sum(f.ByteSize() for f in others)
            response = stream.outbox.join(size, bool(rows) + len(others))
            if rows:  # built in place: no copy of the step's biggest frame
                wire.add_result_tokens(response, out.step, rows, out.num_batched_tokens, entries)
            response.frames.extend(others)
        if hop_trace.ON and (out.completed or out.failed):
            hop_trace.flush()

    def fail_everything(self, error: errors.MstarError) -> None:
        """The engine failed or is stuck: end every running request here (new ones are refused
        by the serving state)."""
        for stream in list(self._streams.values()):
            ends = [wire.request_failed(request_id, error) for request_id in sorted(stream.active)]
            stream.active.clear()
            for span in stream.spans.values():
                _end_span(span, None, error)
            stream.spans.clear()
            if ends:
                stream.outbox.put(gen_pb2.StreamResponse(frames=ends))

    def shutdown(self, error: errors.MstarError) -> None:
        """End every open stream with error (after the drain grace period)."""
        for stream in list(self._streams.values()):
            stream.outbox.put_last(error)

    # -- RPC ----------------------------------------------------------------------------------

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext):
        refusal = self.serving.refusal()
        if self.engine is None or refusal is not None:
            await grpc_errors.abort(context, refusal or errors.unavailable("the model is loading", "STARTING"))
        if self.numerics:
            await context.send_initial_metadata(((NUMERICS_KEY, self.numerics),))
        stream = _Stream(next(self._ids), Outbox(self.max_queued_frames, self.stall_s))
        self._streams[stream.stream_id] = stream
        reader = asyncio.create_task(self._read(stream, request_iterator))
        ticker = None
        interval_ms = self._status_interval_ms(context)
        if interval_ms > 0:
            ticker = asyncio.create_task(self._tick(stream, interval_ms / 1000.0))
        try:
            while True:
                item = await stream.outbox.get()
                if isinstance(item, errors.MstarError):
                    await grpc_errors.abort(context, item)
                if item is not None:
                    if hop_trace.ON:
                        _mark_rows("gen_write", item)
                    yield item
                    stream.outbox.sent()
                    if hop_trace.ON:  # grpc took the message (the next one is asked for)
                        _mark_rows("gen_sent", item)
                if stream.is_half_closed and not stream.active and stream.outbox.empty():
                    return
        finally:
            reader.cancel()
            if ticker is not None:
                ticker.cancel()
            self._streams.pop(stream.stream_id, None)
            if self.engine is not None:
                for request_id in stream.active:
                    self.engine.abort((stream.stream_id, request_id))
            for span in stream.spans.values():
                _end_span(span, None, errors.cancelled("the stream carrying it ended"))

    def _status_interval_ms(self, context) -> int:
        for key, value in context.invocation_metadata() or ():
            if key == STATUS_INTERVAL_KEY:
                try:
                    return max(int(value), 0)
                except ValueError:
                    return 0
        return self.default_status_interval_ms

    async def _tick(self, stream: _Stream, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            stream.outbox.put(wire.conductor_status(self.engine.stats.snapshot()))

    async def _read(self, stream: _Stream, request_iterator) -> None:
        try:
            async for request in request_iterator:
                if len(request.frames) > _MAX_FRAMES:
                    raise contract.violations_error([errors.FieldViolation(
                        "frames", f"must contain no more than {_MAX_FRAMES} item(s)")])
                for i, frame in enumerate(request.frames):
                    self._apply(stream, frame, f"frames[{i}]")
                    if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # a big frame batch must not hold the loop
        except errors.MstarError as e:
            stream.outbox.put_last(e)
            return
        except (grpc.RpcError, asyncio.CancelledError):
            return
        except Exception as exc:  # noqa: BLE001 - a bug must end the stream, never leave it hanging
            stream.outbox.put_last(errors.unexpected(exc, "GenerationService.Stream reader", log))
            return
        stream.is_half_closed = True
        stream.outbox.put_last(None)  # wake the writer so it can end the stream

    def _apply(self, stream: _Stream, frame: gen_pb2.ClientFrame, where: str) -> None:
        kind = frame.WhichOneof("frame")
        request_id = getattr(frame, kind).request_id if kind else ""
        try:
            contract.check(frame, prefix=where, cost=self._cost)
            if frame.HasField("max_tokens") and kind != "client_append":
                raise errors.invalid_argument(f"{where}.max_tokens", "only a client_append that ends the input carries it")
        except errors.MstarError as err:
            if not _is_valid_id(request_id):
                raise  # nothing to attribute it to: the stream ends INVALID_ARGUMENT
            if request_id in stream.active:
                self._fail_locally(stream, request_id, err)
            elif kind == "preprocess_input":
                stream.outbox.put(_single(wire.request_failed(request_id, err)))
            return  # an append/abort for no running request is a no-op, like a valid one
        if kind == "preprocess_input":
            self._start(stream, frame.preprocess_input)
        elif kind == "client_append":
            msg = frame.client_append
            if msg.request_id not in stream.active:
                return  # finished or aborted meanwhile
            try:
                token_ids, input_done, max_tokens = wire.append_of(frame)
            except errors.MstarError as e:
                self._fail_locally(stream, msg.request_id, e)
                return
            self.engine.append((stream.stream_id, msg.request_id), token_ids, input_done, max_tokens)
        elif frame.abort.request_id in stream.active:
            self.engine.abort((stream.stream_id, frame.abort.request_id))

    def _cost(self, frame: gen_pb2.ClientFrame) -> None:
        """Before per-token work: a prompt or chunk longer than the context cannot be served."""
        kind = frame.WhichOneof("frame")
        parts = (frame.preprocess_input.prompt_parts if kind == "preprocess_input"
                 else frame.client_append.chunks if kind == "client_append" else ())
        num_ids = sum(len(part.token_ids.ids) for part in parts)
        # The one rule (common/prompt_fit.py), with no output room assumed: an embedding needs none,
        # and the engine checks the whole prompt with its output room when it admits the tokens.
        check_prompt_fits(num_ids, self.engine.runner.max_model_len, "prompt_token_ids", output_tokens=0)

    def _start(self, stream: _Stream, msg: pb.PreprocessInput) -> None:
        request_id = msg.request_id
        refusal = self.serving.refusal()
        if refusal is not None:
            stream.outbox.put(_single(wire.request_failed(request_id, refusal)))
            return
        if request_id in stream.active:
            # The client lost track of its own request: end it, with this as its one terminal
            # event (refusing only the duplicate left the client two terminal events for one id).
            error = errors.already_exists(f"request {request_id!r} was already running on this stream; both ended")
            self._fail_locally(stream, request_id, error)
            return
        try:
            token_ids, params, input_done, images = wire.request_of(msg, getattr(self.engine.runner, "tile_bytes", None))
        except errors.MstarError as e:
            stream.outbox.put(_single(wire.request_failed(request_id, e)))
            return
        stream.active.add(request_id)
        stream.spans[request_id] = tracing.start_request_span("generation.request", msg.trace_context, {
            "mstar.request_key": request_id, "mstar.prompt_tokens": len(token_ids), "mstar.input_open": not input_done})
        self.engine.add_request((stream.stream_id, request_id), token_ids, params, input_done, images=images)

    def _fail_locally(self, stream: _Stream, request_id: str, error: errors.MstarError) -> None:
        stream.active.discard(request_id)
        _end_span(stream.spans.pop(request_id, None), None, error)
        self.engine.abort((stream.stream_id, request_id))  # its Completion(cancelled) is dropped: not active
        stream.outbox.put(_single(wire.request_failed(request_id, error)))


def _end_span(span: Span | None, item, error: errors.MstarError | None = None) -> None:
    """End a request's span with how it ended: a Completion (finish reason, tokens, the timing
    breakdown) or a Failure / error (status ERROR with its reason)."""
    if span is None:
        return
    error = error or getattr(item, "error", None)
    if error is not None:
        span.set_attribute("mstar.error_reason", error.reason)
        span.set_status(StatusCode.ERROR, error.reason)
    elif item is not None:
        span.set_attributes({
            "mstar.finish_reason": item.finish_reason.label, "mstar.output_tokens": item.num_output_tokens,
            "mstar.cached_tokens": item.num_cached_tokens, "mstar.queue_ms": item.queue_ms,
            "mstar.prefill_ms": item.prefill_ms, "mstar.ttft_ms": item.ttft_ms, "mstar.decode_ms": item.decode_ms,
        })
    span.end()


def _mark_rows(hop: str, response: gen_pb2.StreamResponse) -> None:
    """bench/hops.py: a hop of every token row in `response`."""
    for frame in response.frames:
        if frame.WhichOneof("frame") == "result_tokens" and frame.result_tokens.signal != gen_pb2.SIGNAL_HEARTBEAT:
            rows = frame.result_tokens
            for key, index in zip(rows.request_ids, rows.loop_indices, strict=False):  # tolerant: tracing only
                hop_trace.mark(hop, key, index)


def _is_valid_id(request_id: str) -> bool:
    return 0 < len(request_id) <= _ID.max_len and _ID_PATTERN.fullmatch(request_id) is not None


def _single(frame: gen_pb2.ServerFrame) -> gen_pb2.StreamResponse:
    return gen_pb2.StreamResponse(frames=[frame])
