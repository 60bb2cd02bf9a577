"""mstar.v1.InferenceService: thin protobuf <-> domain layer over RequestRun.

Every RPC follows one pattern: convert the input (wire.py), run the domain object, convert its
events out, and in `finally` close every request the call started. `close` aborts the generation
if it is still running, so client cancel, disconnect and deadline (grpc.aio cancels the handler
task; envoy.md: context.cancelled() is unreliable) all reach the engine through the same path.
A done-callback on the context repeats it, idempotently, in case the task is torn down without
unwinding through our code.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common import errors
from services.common.errors import MstarError, already_exists, not_found
from services.common.metrics import PreprocessMetrics, timing_metadata
from services.common.serving import ServingState
from services.preprocess import client, wire
from services.preprocess.openai.routes import OpenAIRoutes
from services.preprocess.request import Chunk, Complete, Failed
from services.preprocess.request_run import Deps, InputBudget, RequestRun

log = logging.getLogger(__name__)

_SESSION_OUTBOX = 256  # events buffered per session before requests feel backpressure


class InferenceServicer(OpenAIRoutes, api_grpc.InferenceServiceServicer):
    def __init__(self, deps: Deps, state: ServingState, metrics: PreprocessMetrics | None = None) -> None:
        self._deps = deps
        self.state = state  # the process's one serving state: new requests start only when ready
        self.metrics = metrics or PreprocessMetrics()  # unserved unless __main__ passes a served one
        self._runs: dict[str, RequestRun] = {}
        self._created = int(time.time())

    @property
    def num_running(self) -> int:
        return len(self._runs)

    # ---- request lifecycle shared by all RPCs

    def _begin(self, spec, budget: InputBudget, client_key: str) -> tuple[RequestRun, object]:
        refusal = self.state.refusal()  # starting, draining, failed, or the generation backend is down
        if refusal is not None:
            raise refusal
        if spec.model and spec.model not in (self._deps.model.name, "default"):
            raise not_found(f"model {spec.model!r} is not served (see ListModels)", reason="MODEL_NOT_FOUND")
        if spec.request_id in self._runs:
            raise already_exists(
                f"request {spec.request_id} is already running", reason="DUPLICATE_REQUEST_ID"
            )
        run = RequestRun(spec, self._deps, budget, client_key)
        started = time.perf_counter()
        try:
            accepted = run.start()
        except MstarError as err:
            self.metrics.on_admission_rejected(err.reason)
            run.close()
            raise
        except BaseException:
            run.close()
            raise
        self.metrics.on_preprocessed(time.perf_counter() - started)
        self._runs[spec.request_id] = run
        return run, accepted

    def _end(self, run: RequestRun) -> None:
        if self._runs.get(run.request_id) is run:
            del self._runs[run.request_id]
            if (open_s := run.input_open_s) is not None:
                self.metrics.on_input_closed(open_s)
        run.close()

    def _watch(self, context: grpc.aio.ServicerContext, started) -> None:
        def on_done(_ctx) -> None:
            for run in list(started):
                self._end(run)

        context.add_done_callback(on_done)

    # ---- RPCs

    async def Generate(self, request: api.GenerateRequest, context) -> api.GenerateResponse:
        started: list[RequestRun] = []
        self._watch(context, started)
        try:
            spec = wire.request_spec(request.input)
            if spec.open_inputs and not request.input.request_id:
                # Unary Generate never reveals a server-assigned id, so nobody could Append to
                # it: the request would hold an admission slot until Envoy's idle timeout
                # (found by tests/reliability/test_fuzz.py). Streamed input needs a chosen id.
                raise errors.invalid_argument(
                    "input.request_id", "streamed input (input_modalities) on Generate needs a client-chosen "
                    "request_id to Append to; or use GenerateStream / Session")
            run, _ = self._begin(spec, InputBudget(self._deps.limits), client.of_context(context))
            started.append(run)
            text, token_ids, logprobs = [], [], []
            async for event in self.metrics.observe(run.events(), run.request_id, "Generate"):
                if isinstance(event, Chunk):
                    text.append(event.text)
                    token_ids += event.token_ids
                    logprobs += event.logprobs
                elif isinstance(event, Failed):
                    raise event.error
                elif isinstance(event, Complete):
                    complete = wire.complete(event)
                    await context.send_initial_metadata(timing_metadata(complete))  # x-mstar-* headers via Envoy
                    return api.GenerateResponse(
                        request_id=run.request_id,
                        client_request_id=spec.client_request_id,
                        text="".join(text),
                        token_ids=token_ids,
                        logprobs=wire._logprobs(logprobs),
                        complete=complete,
                    )
            raise errors.internal("request ended without a terminal event")
        except MstarError as err:
            await errors.abort(context, err)
        finally:
            for run in started:
                self._end(run)

    async def GenerateStream(self, request: api.GenerateStreamRequest, context):
        async for event in self.stream(request.input, context, surface="GenerateStream"):
            yield event

    async def stream(self, inp, context, surface: str):
        """One request's GenerateStreamResponse events, for GenerateStream and for the HTTP
        surfaces built on it (openai/routes.py); `surface` labels its metrics and log line."""
        started: list[RequestRun] = []
        self._watch(context, started)
        try:
            try:
                spec = wire.request_spec(inp)
                run, accepted = self._begin(spec, InputBudget(self._deps.limits), client.of_context(context))
                started.append(run)
            except MstarError as err:
                await errors.abort(context, err)  # before any message: a real status
                return
            yield wire.stream_event(accepted)
            async for event in self.metrics.observe(run.events(), run.request_id, surface):
                yield wire.stream_event(event)
        finally:
            for run in started:
                self._end(run)

    async def Session(self, request_iterator, context):
        started: set[RequestRun] = set()  # running requests of this session only
        self._watch(context, started)
        outbox: asyncio.Queue = asyncio.Queue(maxsize=_SESSION_OUTBOX)
        budget = InputBudget(self._deps.limits)
        client_key = client.of_context(context)  # every request of a session shares its client's share
        pumps: set[asyncio.Task] = set()

        async def pump(run: RequestRun) -> None:
            try:
                async for event in self.metrics.observe(run.events(), run.request_id, "Session"):
                    await outbox.put(event)
            finally:
                self._end(run)
                started.discard(run)

        async def read() -> None:
            try:
                async for message in request_iterator:
                    await self._session_action(message, budget, client_key, started, pumps, pump, outbox)
                await asyncio.gather(*pumps)  # half-closed: running requests still finish
                await outbox.put(None)
            except MstarError as err:  # per-session caps: ends the whole session
                await outbox.put(err)

        reader = asyncio.create_task(read())
        try:
            while (item := await outbox.get()) is not None:
                if isinstance(item, MstarError):
                    await errors.abort(context, item)
                yield wire.session_event(item)
            await reader
        finally:
            reader.cancel()
            for task in pumps:
                task.cancel()
            for run in started:
                self._end(run)

    async def _session_action(self, message, budget, client_key, started, pumps, pump, outbox) -> None:
        action = message.WhichOneof("action")
        if action == "start":
            request_id = message.start.request_id
            try:
                spec = wire.request_spec(message.start)
                request_id = spec.request_id
                run, accepted = self._begin(spec, budget, client_key)
            except MstarError as err:
                if err.reason == "INPUT_LIMIT":
                    raise
                await outbox.put(Failed(request_id, err))  # per-request errors never end the session
                return
            started.add(run)
            await outbox.put(accepted)
            task = asyncio.create_task(pump(run))
            pumps.add(task)
            task.add_done_callback(pumps.discard)
        elif action == "append":
            try:
                self._append(wire.append_spec(message.append))
            except MstarError as err:
                if err.reason == "INPUT_LIMIT":
                    raise
                await outbox.put(Failed(message.append.request_id, err))
        elif action == "cancel":
            run = self._runs.get(message.cancel.request_id)
            if run is not None:
                run.cancel()

    def _append(self, spec) -> RequestRun:
        run = self._runs.get(spec.request_id)
        if run is None:
            raise not_found(f"request {spec.request_id!r} is not running", reason="REQUEST_NOT_FOUND")
        run.append(spec)
        return run

    async def Append(self, request: api.AppendRequest, context) -> api.AppendResponse:
        try:
            run = self._append(wire.append_spec(request.append))
            return api.AppendResponse(
                request_id=run.request_id, prompt_tokens=run.prompt_tokens, input_ended=run.input_done
            )
        except MstarError as err:
            await errors.abort(context, err)

    async def Cancel(self, request: api.CancelRequest, context) -> api.CancelResponse:
        run = self._runs.get(request.request_id)
        return api.CancelResponse(request_id=request.request_id, cancelled=bool(run and run.cancel()))

    async def ListModels(self, request: api.ListModelsRequest, context) -> api.ListModelsResponse:
        model = self._deps.model
        return api.ListModelsResponse(
            object="list",
            data=[
                api.Model(
                    id=model.name,
                    object="model",
                    created=self._created,
                    owned_by="mstar",
                    max_model_len=model.context_length,
                    input_modalities=[wire.MODALITY_ENUMS[m] for m in sorted(model.input_modalities)],
                )
            ],
        )

    async def drain(self, grace_s: float) -> None:
        """SIGTERM (the state is DRAINING: new requests are refused): let running ones finish
        within the grace period, then cancel the rest."""
        deadline = time.monotonic() + grace_s
        while self._runs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for run in list(self._runs.values()):
            run.cancel()
