"""mstar.v1.InferenceService: the protobuf <-> domain layer over the RequestRunner.

Every RPC follows one pattern: check the message against the contract's declared bounds, convert
it (wire.py), run it through the runner (services/preprocess/runner.py, the same path every HTTP
surface takes), convert its events out. Each call owns a RunScope whose streams are closed in
`finally` and, again, by a done-callback on the context, so client cancel, disconnect and deadline
(grpc.aio cancels the handler task; envoy.md: context.cancelled() is unreliable) all reach the
engine through the same idempotent path. The HTTP surfaces' RPCs come from HttpRoutes
(http_routes.py).

An Append or Cancel (RPC or Session action) for a request this replica does not run goes to the
preprocess replica that does (peers.py); server-assigned ids carry that owner's tag.

In a Session, a refused action (a start that got no id, a duplicate start, an append or cancel
naming no running request) is reported as a `failed` event with an EMPTY request_id, so it never
adds a second terminal event to a request that runs or ran under that id (issue 13, finding 6).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import aclosing
from pathlib import Path

from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from services.common import contract, errors, grpc_errors
from services.common.errors import MstarError
from services.common.metrics import PreprocessMetrics, timing_headers
from services.common.serving import ServingState
from services.preprocess import call, client, peers, wire
from services.preprocess.http_routes import HttpRoutes
from services.preprocess.peers import Peers
from services.preprocess.request import Chunk, Complete, Failed, Tensor
from services.preprocess.request_run import Deps
from services.preprocess.runner import RequestRunner, RunScope, RunStream
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.responses.store import ResponseStore

log = logging.getLogger(__name__)

_SESSION_OUTBOX = 256  # events buffered per session before requests feel backpressure
_ID = contract.bounds(pb.PreprocessInput, "request_id")
_CLIENT_ID = contract.bounds(pb.PreprocessInput, "client_request_id")


class InferenceServicer(HttpRoutes, api_grpc.InferenceServiceServicer):
    def __init__(self, deps: Deps, state: ServingState, metrics: PreprocessMetrics | None = None,
                 store: ResponseStore | None = None) -> None:
        self.runner = RequestRunner(deps, state, metrics)
        # Without a configured database (tests, embedding), stored responses live in memory.
        self.responses = ResponsesApi(store or ResponseStore(Path(":memory:")))
        self.created = int(time.time())
        # The other preprocess replicas (Append/Cancel for requests they run; the owner tag in
        # server-assigned ids). Alone by default; __main__ sets the real one once the port is bound.
        self.peers = Peers(None, advertise="")

    @property
    def metrics(self) -> PreprocessMetrics:
        return self.runner.metrics

    @property
    def state(self) -> ServingState:
        return self.runner.state

    @property
    def num_running(self) -> int:
        return self.runner.num_running

    def _scope(self, context) -> RunScope:
        return call.scope_of(self.runner, context)

    def _check(self, msg, prefix: str = "") -> None:
        """The contract's declared bounds, counts first, before any per-element work (the runner
        then refuses a prompt that cannot fit before the template and tokenizer run)."""
        contract.check(msg, prefix=prefix)

    # ---- RPCs

    async def Generate(self, request: api.GenerateRequest, context) -> api.GenerateResponse:
        scope = self._scope(context)
        try:
            scope.budget.charge(request.ByteSize(), is_append=False)  # on arrival, before any work
            self._check(request)
            spec = wire.request_spec(request.input, "Generate", self.peers.new_request_id)
            if spec.open_inputs and not request.input.request_id:
                # Unary Generate never reveals a server-assigned id, so nobody could Append to
                # it: the request would hold an admission slot until Envoy's idle timeout
                # (found by tests/reliability/test_fuzz.py). Streamed input needs a chosen id.
                raise errors.invalid_argument(
                    "input.request_id", "streamed input (input_modalities) on Generate needs a client-chosen "
                    "request_id to Append to; or use GenerateStream / Session")
            async with aclosing(scope.run(spec)) as stream:
                await anext(stream)  # accepted
                text, token_ids, logprobs, tensors = [], [], [], []
                async for event in stream:
                    if isinstance(event, Chunk):
                        text.append(event.text)
                        token_ids += event.token_ids
                        logprobs += event.logprobs
                    elif isinstance(event, Tensor):
                        tensors.append(wire.tensors(event))
                    elif isinstance(event, Failed):
                        raise event.error
                    elif isinstance(event, Complete):
                        await context.send_initial_metadata(timing_headers(event))  # x-mstar-* headers via Envoy
                        return api.GenerateResponse(
                            request_id=spec.request_id,
                            client_request_id=spec.client_request_id,
                            text="".join(text),
                            token_ids=token_ids,
                            logprobs=wire._logprobs(logprobs),
                            complete=wire.complete(event),
                            tensors=tensors,
                        )
            raise errors.internal("request ended without a terminal event")
        except MstarError as err:
            await grpc_errors.abort(context, err)
        finally:
            scope.close()

    async def GenerateStream(self, request: api.GenerateStreamRequest, context):
        scope = self._scope(context)
        try:
            try:
                scope.budget.charge(request.ByteSize(), is_append=False)  # on arrival, before any work
                self._check(request)
                stream = scope.run(wire.request_spec(request.input, "GenerateStream", self.peers.new_request_id))
                accepted = await anext(stream)
            except MstarError as err:
                await grpc_errors.abort(context, err)  # before any message: a real status
                return
            sent = wire.Sent()
            yield wire.stream_event(accepted, sent)
            async with aclosing(stream):
                async for event in stream:
                    yield wire.stream_event(event, sent)
        finally:
            scope.close()

    async def Session(self, request_iterator, context):
        scope = self._scope(context)  # one input budget for the whole session
        outbox: asyncio.Queue = asyncio.Queue(maxsize=_SESSION_OUTBOX)
        pumps: set[asyncio.Task] = set()

        async def pump(stream: RunStream) -> None:
            async with aclosing(stream):
                async for event in stream:
                    await outbox.put(event)

        async def read() -> None:
            try:
                async for message in request_iterator:
                    await self._session_action(message, scope, pumps, pump, outbox)
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
                    await grpc_errors.abort(context, item)
                counter = sent.setdefault(item.request_id, wire.Sent()) if item.request_id else None
                yield wire.session_event(item, counter)
                if isinstance(item, Complete | Failed):
                    sent.pop(item.request_id, None)
            await reader
        finally:
            reader.cancel()
            for task in pumps:
                task.cancel()
            scope.close()

    async def _session_action(self, message, scope: RunScope, pumps, pump, outbox) -> None:
        action = message.WhichOneof("action")
        # Every message counts against the session's input caps as it arrives, refused ones
        # included: an INPUT_LIMIT error here ends the session.
        scope.budget.charge(message.ByteSize(), is_append=action == "append")
        if action == "start":
            start = message.start
            try:
                self._check(start, prefix="start")
                stream = scope.run(wire.request_spec(start, "Session", self.peers.new_request_id))
                accepted = await anext(stream)
            except MstarError as err:
                # Per-request errors never end the session. Attributed to the chosen id only if
                # it is a valid id no request is running under; the client's own id is echoed.
                rid = start.request_id if self._is_free_id(start.request_id) else ""
                crid = start.client_request_id if len(start.client_request_id) <= _CLIENT_ID.max_len else ""
                await outbox.put(Failed(rid, err, client_request_id=crid))
                return
            await outbox.put(accepted)
            task = asyncio.create_task(pump(stream))
            pumps.add(task)
            task.add_done_callback(pumps.discard)
        elif action == "append":
            who = client.principal(scope.client)
            try:
                self._check(message)
                if self.runner.find(message.append.request_id, who) is not None:
                    self.runner.append(wire.append_spec(message.append), charged=True, principal=who)
                else:  # started through another replica
                    await self.peers.append(api.AppendRequest(append=message.append), who)
            except MstarError as err:
                run = self.runner.find(message.append.request_id, who)
                if run is None or not run.ended:
                    await outbox.put(Failed("", err))  # refused; the request (if any) is unaffected
                # else the append failed the request: its own terminal event carries the error
        elif action == "cancel":
            try:
                self._check(message)
            except MstarError as err:
                await outbox.put(Failed("", err))
                return
            request_id, who = message.cancel.request_id, client.principal(scope.client)
            if self.runner.find(request_id, who) is None:  # started through another replica, or not yet
                if (await self.peers.cancel(api.CancelRequest(request_id=request_id), who)).cancelled:
                    return
            self.runner.cancel(request_id, who)  # not running anywhere: remembered, its start may be on the way

    def _is_free_id(self, request_id: str) -> bool:
        return (0 < len(request_id) <= _ID.max_len and re.fullmatch(_ID.pattern, request_id) is not None
                and self.runner.find(request_id) is None)

    async def Append(self, request: api.AppendRequest, context) -> api.AppendResponse:
        who = client.principal(client.of_context(context))  # only the request's own principal appends
        try:
            self._check(request)
            if self.runner.find(request.append.request_id, who) is None and not peers.is_forwarded(context):
                return await self.peers.append(request, who)  # the owner's answer (or NOT_FOUND)
            run = self.runner.append(wire.append_spec(request.append), principal=who)
            return api.AppendResponse(
                request_id=run.request_id, prompt_tokens=run.prompt_tokens, input_ended=run.input_done
            )
        except MstarError as err:
            await grpc_errors.abort(context, err)

    async def Cancel(self, request: api.CancelRequest, context) -> api.CancelResponse:
        try:
            self._check(request)
        except MstarError as err:
            await grpc_errors.abort(context, err)
        who = client.principal(client.of_context(context))  # only the request's own principal cancels
        if self.runner.find(request.request_id, who) is None and not peers.is_forwarded(context):
            try:
                answer = await self.peers.cancel(request, who)  # the owner's answer (cancelled: false if none)
            except MstarError as err:
                await grpc_errors.abort(context, err)
            if answer.cancelled:
                return answer
        # Here, or nowhere yet: a cancel that overtook its start is remembered (RequestRunner.cancel),
        # and a start that arrived while the peers were asked is cancelled now.
        return api.CancelResponse(request_id=request.request_id, cancelled=self.runner.cancel(request.request_id, who))

    async def ListModels(self, request: api.ListModelsRequest, context) -> api.ListModelsResponse:
        model = self.runner.model
        return api.ListModelsResponse(
            object="list",
            data=[
                api.Model(
                    id=model.name,
                    object="model",
                    created=self.created,
                    owned_by="mstar",
                    max_model_len=model.context_length,
                    input_modalities=[wire.MODALITY_ENUMS[m] for m in sorted(model.input_modalities)],
                    numerics=wire.model_numerics(self.runner.numerics),
                    family=model.family,
                )
            ],
        )

    async def drain(self, grace_s: float, accept_s: float = 0.0) -> None:
        """SIGTERM: take new requests `accept_s` more, then refuse them; let running ones finish
        within the grace period (RequestRunner.drain)."""
        await self.runner.drain(grace_s, accept_s)
