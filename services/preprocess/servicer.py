"""mstar.v1.InferenceService: thin protobuf <-> domain layer over RequestRun.

Every RPC follows one pattern: convert the input (wire.py), run the domain object, convert its
events out, and in `finally` close every request the call started. `close` aborts the generation
if it is still running, so client cancel, disconnect and deadline (grpc.aio cancels the handler
task; envoy.md: context.cancelled() is unreliable) all reach the engine through the same path.
A done-callback on the context repeats it, idempotently, in case the task is torn down without
unwinding through our code.

Every request message is first checked against the contract's declared bounds and a prompt
cost estimate (`_check`), before any per-element work. In a Session, a refused action (a start
that got no id, a duplicate start, an append or cancel naming no running request) is reported as
a `failed` event with an EMPTY request_id, so it never adds a second terminal event to a request
that runs or ran under that id (issue 13, finding 6).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from services.common import contract, errors
from services.common.errors import MstarError, already_exists, not_found, quote
from services.common.metrics import PreprocessMetrics, timing_metadata
from services.common.serving import ServingState
from services.preprocess import client, peers, wire
from services.preprocess import limits as caps
from services.preprocess.openai.routes import OpenAIRoutes
from services.preprocess.peers import Peers
from services.preprocess.request import Chunk, Complete, Failed
from services.preprocess.request_run import Deps, InputBudget, RequestRun

log = logging.getLogger(__name__)

_SESSION_OUTBOX = 256  # events buffered per session before requests feel backpressure
_ID = contract.bounds(pb.PreprocessInput, "request_id")
_CLIENT_ID = contract.bounds(pb.PreprocessInput, "client_request_id")


class InferenceServicer(OpenAIRoutes, api_grpc.InferenceServiceServicer):
    def __init__(self, deps: Deps, state: ServingState, metrics: PreprocessMetrics | None = None) -> None:
        self._deps = deps
        self.state = state  # the process's one serving state: new requests start only when ready
        self.metrics = metrics or PreprocessMetrics()  # unserved unless __main__ passes a served one
        self._runs: dict[str, RequestRun] = {}
        self._created = int(time.time())
        # The other preprocess replicas (Append/Cancel for requests they run; the owner tag in
        # server-assigned ids). Alone by default; __main__ sets the real one once the port is bound.
        self.peers = Peers(None, advertise="")
        self._accept_until = 0.0  # draining, but still taking new requests until then (drain())

    @property
    def num_running(self) -> int:
        return len(self._runs)

    # ---- request lifecycle shared by all RPCs

    def _begin(self, spec, budget: InputBudget, client_key: str) -> tuple[RequestRun, object]:
        refusal = self.state.refusal()  # starting, draining, failed, or no generation replica serves
        if refusal is not None and not (refusal.reason == "DRAINING" and time.monotonic() < self._accept_until):
            refusal.refused = True  # nothing started: Envoy may run it on another replica
            raise refusal
        if spec.model and spec.model not in (self._deps.model.name, "default"):
            raise not_found(f"model {quote(spec.model)} is not served (see ListModels)", reason="MODEL_NOT_FOUND")
        if spec.request_id in self._runs:
            raise already_exists(
                f"request {quote(spec.request_id)} is already running", reason="DUPLICATE_REQUEST_ID"
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

    def _check(self, msg, prompt: pb.PreprocessInput | pb.ClientAppend | None, where: str, prefix: str = "") -> None:
        """Declared bounds, counts first; then a prompt (or appended chunk) that cannot fit the
        context is refused before the template, the tokenizer or per-token validation run.
        `prompt` is the PreprocessInput or ClientAppend inside `msg`, found at field path `where`."""
        model = self._deps.model

        def cost(_msg) -> None:
            if isinstance(prompt, pb.PreprocessInput):
                texts = (prompt.text, *(m.content for m in prompt.messages))
                parts, field = prompt.prompt_parts, "prompt_parts" if prompt.prompt_parts else "text"
            else:
                texts, parts, field = (prompt.text,), prompt.chunks, "chunks"
            n = wire.min_prompt_tokens(parts, model.tokenizer.max_token_bytes, *texts)
            caps.check_prompt_fits(n, model.context_length, f"{where}.{field}")

        contract.check(msg, prefix=prefix, cost=cost if prompt is not None else None)

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
            budget = InputBudget(self._deps.limits)
            budget.charge(request.ByteSize(), is_append=False)
            self._check(request, request.input, "input")
            spec = wire.request_spec(request.input, self.peers.new_request_id)
            if spec.open_inputs and not request.input.request_id:
                # Unary Generate never reveals a server-assigned id, so nobody could Append to
                # it: the request would hold an admission slot until Envoy's idle timeout
                # (found by tests/reliability/test_fuzz.py). Streamed input needs a chosen id.
                raise errors.invalid_argument(
                    "input.request_id", "streamed input (input_modalities) on Generate needs a client-chosen "
                    "request_id to Append to; or use GenerateStream / Session")
            run, _ = self._begin(spec, budget, client.of_context(context))
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
                budget = InputBudget(self._deps.limits)
                budget.charge(inp.ByteSize(), is_append=False)
                self._check(inp, inp, "input", prefix="input")
                spec = wire.request_spec(inp, self.peers.new_request_id)
                run, accepted = self._begin(spec, budget, client.of_context(context))
                started.append(run)
            except MstarError as err:
                await errors.abort(context, err)  # before any message: a real status
                return
            sent = wire.Sent()
            yield wire.stream_event(accepted, sent)
            async for event in self.metrics.observe(run.events(), run.request_id, surface):
                yield wire.stream_event(event, sent)
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
            except MstarError as err:  # per-session caps, undecodable message: ends the session
                await outbox.put(err)
            except Exception as exc:  # noqa: BLE001 - a bug ends the session, never leaves it hanging
                await outbox.put(errors.unexpected(exc, "InferenceService.Session reader", log))

        reader = asyncio.create_task(read())
        sent: dict[str, wire.Sent] = {}  # per running request id
        try:
            while (item := await outbox.get()) is not None:
                if isinstance(item, MstarError):
                    await errors.abort(context, item)
                counter = sent.setdefault(item.request_id, wire.Sent()) if item.request_id else None
                yield wire.session_event(item, counter)
                if isinstance(item, Complete | Failed):
                    sent.pop(item.request_id, None)
            await reader
        finally:
            reader.cancel()
            for task in pumps:
                task.cancel()
            for run in started:
                self._end(run)

    async def _session_action(self, message, budget, client_key, started, pumps, pump, outbox) -> None:
        action = message.WhichOneof("action")
        # Every message counts against the session's input caps as it arrives, refused ones
        # included: an INPUT_LIMIT error here ends the session.
        budget.charge(message.ByteSize(), is_append=action == "append")
        if action == "start":
            start = message.start
            try:
                self._check(start, start, "start", prefix="start")
                spec = wire.request_spec(start, self.peers.new_request_id)
                run, accepted = self._begin(spec, budget, client_key)
            except MstarError as err:
                # Per-request errors never end the session. Attributed to the chosen id only if
                # it is a valid id no request is running under; the client's own id is echoed.
                rid = start.request_id if self._is_free_id(start.request_id) else ""
                crid = start.client_request_id if len(start.client_request_id) <= _CLIENT_ID.max_len else ""
                await outbox.put(Failed(rid, err, client_request_id=crid))
                return
            started.add(run)
            await outbox.put(accepted)
            task = asyncio.create_task(pump(run))
            pumps.add(task)
            task.add_done_callback(pumps.discard)
        elif action == "append":
            try:
                self._check(message, message.append, "append")
                if message.append.request_id in self._runs:
                    self._append(wire.append_spec(message.append), charged=True)
                else:  # started through another replica
                    await self.peers.append(api.AppendRequest(append=message.append))
            except MstarError as err:
                run = self._runs.get(message.append.request_id)
                if run is None or not run.ended:
                    await outbox.put(Failed("", err))  # refused; the request (if any) is unaffected
                # else the append failed the request: its own terminal event carries the error
        elif action == "cancel":
            try:
                contract.check(message)
            except MstarError as err:
                await outbox.put(Failed("", err))
                return
            run = self._runs.get(message.cancel.request_id)
            if run is not None:
                run.cancel()
            else:
                await self.peers.cancel(api.CancelRequest(request_id=message.cancel.request_id))

    def _is_free_id(self, request_id: str) -> bool:
        return (0 < len(request_id) <= _ID.max_len and re.fullmatch(_ID.pattern, request_id) is not None
                and request_id not in self._runs)

    def _append(self, spec, charged: bool = False) -> RequestRun:
        run = self._runs.get(spec.request_id)
        if run is None:
            raise not_found(f"request {quote(spec.request_id)} is not running", reason="REQUEST_NOT_FOUND")
        run.append(spec, charged)
        return run

    async def Append(self, request: api.AppendRequest, context) -> api.AppendResponse:
        try:
            self._check(request, request.append, "append")
            if request.append.request_id not in self._runs and not peers.is_forwarded(context):
                return await self.peers.append(request)  # the owner's answer (or NOT_FOUND)
            run = self._append(wire.append_spec(request.append))
            return api.AppendResponse(
                request_id=run.request_id, prompt_tokens=run.prompt_tokens, input_ended=run.input_done
            )
        except MstarError as err:
            await errors.abort(context, err)

    async def Cancel(self, request: api.CancelRequest, context) -> api.CancelResponse:
        try:
            contract.check(request)
        except MstarError as err:
            await errors.abort(context, err)
        run = self._runs.get(request.request_id)
        if run is None and not peers.is_forwarded(context):
            try:
                return await self.peers.cancel(request)
            except MstarError as err:
                await errors.abort(context, err)
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
                    numerics=wire.model_numerics(self._deps.backend.numerics),
                )
            ],
        )

    async def drain(self, grace_s: float, accept_s: float = 0.0) -> None:
        """SIGTERM (the state is DRAINING, health NOT_SERVING): keep taking new requests for
        `accept_s`, the time Envoy's health checks need to stop sending any (refusing them at once
        would lean on retries, and least-request keeps picking the replica that is emptying), then
        refuse new requests and let running ones finish within the grace period."""
        deadline = time.monotonic() + grace_s
        self._accept_until = time.monotonic() + min(accept_s, grace_s)
        await asyncio.sleep(min(accept_s, grace_s))
        while self._runs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for run in list(self._runs.values()):
            run.cancel()
