"""The request runner: the one way any API surface runs a request.

    scope = runner.scope()                   # one per RPC call (shares that call's input budget)
    stream = scope.run(spec)                 # nothing happens yet
    accepted = await anext(stream)           # validation + admission: raises MstarError, no event
    async for event in stream: ...           # Chunk | KeepAlive | Profile ..., then Complete | Failed
    await stream.aclose()                    # always (contextlib.aclosing); aborts if still running

The native RPCs (Generate, GenerateStream, Session) and every HTTP surface (services/preprocess/
surfaces/) consume it, so admission, validation, stop strings, keep-alives, metrics and
cancel-on-disconnect behave the same everywhere and no surface calls another RPC. Events are the
domain types of request.py, never protobuf; a request kind that produces tensors (embeddings)
adds its event type there and flows through the same stream. Metrics and logs label every
request with `spec.surface` ("chat.completions", "messages", "responses", "GenerateStream", ...).

`scope.close()` is the safety net for a call torn down without unwinding through our code (the
servicer registers it as the gRPC context's done-callback): it closes every stream the call
started. Closing is idempotent, so cancel, disconnect, deadline and completion all use it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from services.common.contract import declared
from services.common.errors import (
    Code,
    MstarError,
    already_exists,
    cancelled,
    invalid_argument,
    not_found,
    quote,
)
from services.common.metrics import PreprocessMetrics
from services.common.prompt_fit import check_prompt_fits
from services.common.serving import ServingState
from services.preprocess.client import principal as principal_of
from services.preprocess.input_names import input_names
from services.preprocess.limits import InputBudget
from services.preprocess.model import ModelSpec
from services.preprocess.prompt import PromptBuilder, min_prompt_tokens
from services.preprocess.request import Accepted, AppendSpec, Event, RequestSpec
from services.preprocess.request_run import Deps, RequestRun

_MAX_MESSAGES = declared("mstar.v1.PreprocessInput", "messages").max_items
# A Cancel by id may overtake the start it is about: they are two calls, maybe on two connections,
# and nothing orders them (Envoy, peers). A cancel for an id that is not running is remembered this
# long, and a start under that id arriving meanwhile ends at once, cancelled, instead of running to
# its deadline (issue 28: 35 of 200 in a cancel storm). An id that ended within that time is not
# remembered: a late cancel of a finished request must not cancel the id's next use.
_CANCEL_AHEAD_S = 10.0
_REMEMBERED_IDS = 10_000  # each of the two id memories holds at most this many (oldest go first)


class _RecentIds:
    """Ids noted within the last `ttl_s` seconds (at most `limit` of them, the newest)."""

    def __init__(self, ttl_s: float, limit: int) -> None:
        self._ttl_s = ttl_s
        self._limit = limit
        self._noted: OrderedDict[str, float] = OrderedDict()  # id -> when, oldest first

    def add(self, request_id: str) -> None:
        self._noted.pop(request_id, None)
        self._noted[request_id] = time.monotonic()
        expired = time.monotonic() - self._ttl_s
        while self._noted and (len(self._noted) > self._limit or next(iter(self._noted.values())) < expired):
            self._noted.popitem(last=False)

    def __contains__(self, request_id: str) -> bool:
        noted = self._noted.get(request_id)
        return noted is not None and time.monotonic() - noted < self._ttl_s

    def pop(self, request_id: str) -> bool:
        """Whether `request_id` was noted (and still is); it is forgotten either way."""
        found = request_id in self
        self._noted.pop(request_id, None)
        return found


def _ahead_key(principal: str | None, request_id: str) -> str:
    """A remembered cancel's key: the id as the principal named it (None: any principal's)."""
    return request_id if principal is None else f"{principal}\x00{request_id}"


class RequestRunner:
    """Every running request of this server, by id; the admission gate in front of them."""

    def __init__(self, deps: Deps, state: ServingState, metrics: PreprocessMetrics | None = None) -> None:
        self.deps = deps
        self.state = state  # the process's one serving state: new requests start only when ready
        self.metrics = metrics or PreprocessMetrics()  # unserved unless __main__ passes a served one
        self._runs: dict[str, RequestRun] = {}
        self._cancelled_ahead = _RecentIds(_CANCEL_AHEAD_S, _REMEMBERED_IDS)  # cancels that came first
        self._ended = _RecentIds(_CANCEL_AHEAD_S, _REMEMBERED_IDS)
        self._accept_until = 0.0  # draining, but still taking new requests until then (drain())

    @property
    def model(self) -> ModelSpec:
        return self.deps.model

    @property
    def numerics(self) -> dict:
        """How the generation backend computes (ReplicaPool.numerics: JSON fields); {} before one connected."""
        return self.deps.backend.numerics

    @property
    def num_running(self) -> int:
        return len(self._runs)

    def scope(self, client: str = "") -> RunScope:
        """A scope for one RPC call; `client` is its admission key (client.py: fair shares)."""
        return RunScope(self, client)

    def find(self, request_id: str, principal: str | None = None) -> RequestRun | None:
        """The running request `request_id`; with `principal`, only if it is that principal's
        (client.principal): another's request is as absent as one that never ran, so one tenant
        can neither append to, cancel nor learn of another's requests."""
        run = self._runs.get(request_id)
        if run is None or (principal is not None and principal_of(run.client) != principal):
            return None
        return run

    def append(self, spec: AppendSpec, charged: bool = False, principal: str | None = None) -> RequestRun:
        """More input for a running request (the principal's, when given). A chunk that cannot
        fit is refused before any per-element work, leaving the request untouched."""
        run = self.find(spec.request_id, principal)
        if run is None:
            raise not_found(f"request {quote(spec.request_id)} is not running", reason="REQUEST_NOT_FOUND")
        model = self.deps.model
        least = min_prompt_tokens(spec.parts, model.tokenizer.max_token_bytes)
        check_prompt_fits(run.prompt_tokens + least, model.context_length, "append.chunks")
        run.append(spec, charged)
        return run

    def cancel(self, request_id: str, principal: str | None = None) -> bool:
        """Stop a running request (the principal's, when given; it ends with finish reason
        cancelled); False if not running. An id that is not running and did not just end is
        remembered for that principal: its start may still be on the way, and then begins
        cancelled (_CANCEL_AHEAD_S). Another principal's start under that id is not touched."""
        run = self.find(request_id, principal)
        if run is None:
            if request_id not in self._runs and request_id not in self._ended:
                self._cancelled_ahead.add(_ahead_key(principal, request_id))
            return False
        return run.cancel()

    def check_model(self, model: str) -> None:
        """`model` must be empty or name the served model (ModelSpec.answers_to; 404 otherwise)."""
        if model and not self.deps.model.answers_to(model):
            raise not_found(f"model {quote(model)} is not served (see GET /v1/models)", reason="MODEL_NOT_FOUND")

    def prompt_token_ids(self, spec: RequestSpec) -> list[int]:
        """The prompt a request would run (template + tokenization), without running it: for
        count_tokens and /tokenize. Same validation errors as a real request."""
        return PromptBuilder(self.deps.model, self.deps.files).start(spec)

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

    # ---- used by RunStream

    def _begin(self, spec: RequestSpec, budget: InputBudget, client: str) -> tuple[RequestRun, Accepted]:
        refusal = self.state.refusal()  # starting, draining, failed, or no generation replica serves
        if refusal is not None and not (refusal.reason == "DRAINING" and time.monotonic() < self._accept_until):
            refusal.refused = True  # nothing started: Envoy may run it on another replica
            raise refusal
        self.check_model(spec.model)
        if spec.request_id in self._runs:
            raise already_exists(f"request {quote(spec.request_id)} is already running", reason="DUPLICATE_REQUEST_ID")
        self._check_cost(spec)
        run = RequestRun(spec, self.deps, budget, client)
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
        self.metrics.on_preprocessed(time.perf_counter() - started, tuple(run.input_infos))
        self._runs[spec.request_id] = run
        principal = principal_of(run.client)
        if self._cancelled_ahead.pop(_ahead_key(principal, spec.request_id)) | self._cancelled_ahead.pop(
                _ahead_key(None, spec.request_id)):
            run.cancel()  # the client's cancel came first: the request ends cancelled, as if it came next
        return run, accepted

    def _check_cost(self, spec: RequestSpec) -> None:
        """A prompt that cannot fit the context is refused before any per-element work (template,
        tokenizer), whatever surface it came from: a few huge requests must not stall the loop."""
        model = self.deps.model
        names = input_names(spec.surface)
        try:
            if len(spec.messages) > _MAX_MESSAGES:  # e.g. a long conversation continued by reference
                raise invalid_argument(names.messages, f"at most {_MAX_MESSAGES} messages in one conversation")
            least = min_prompt_tokens(spec.parts, model.tokenizer.max_token_bytes, spec.text,
                                      *(m.content for m in spec.messages))
            check_prompt_fits(least, model.context_length, names.messages if spec.messages else names.text,
                              output_tokens=0 if spec.embedding is not None else 1)
        except MstarError as err:
            self.metrics.on_admission_rejected(err.reason)
            raise

    def _end(self, run: RequestRun) -> None:
        if self._runs.get(run.request_id) is run:
            del self._runs[run.request_id]
            self._ended.add(run.request_id)
            if (open_s := run.input_open_s) is not None:
                self.metrics.on_input_closed(open_s)
        run.close()


class RunScope:
    """The requests one RPC call started: they share the call's input budget (every message is
    charged to it on arrival, by the servicer or the HTTP adapter) and its client's admission share."""

    def __init__(self, runner: RequestRunner, client: str = "") -> None:
        self.runner = runner
        self.client = client
        self.budget = InputBudget(runner.deps.limits)
        # What the call's requests were told on admission (Accepted.warnings, e.g. a clamped
        # max_tokens), each once, in order: the HTTP adapter sends them as Warning headers.
        self.warnings: list[str] = []
        self._streams: set[RunStream] = set()
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None

    def run(self, spec: RequestSpec) -> RunStream:
        stream = RunStream(self.runner, spec, self.budget, self.client, self._streams.discard, self._note)
        if self._closed:  # the call already ended (e.g. its deadline passed before the handler ran)
            stream.close(cancelled("the call ended before the request started"))
        else:
            self._streams.add(stream)
        return stream

    def _note(self, accepted: Accepted) -> None:
        self.warnings += [w for w in accepted.warnings if w not in self.warnings]

    def close_after(self, seconds: float | None) -> None:
        """Close every stream of the call at its deadline even if nothing else does: grpc.aio does
        not always cancel a handler whose deadline passed (seen for unary calls whose deadline
        expired as the handler started), and the request would then run to its end."""
        if seconds is not None:
            expired = MstarError(Code.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", "the call's deadline passed")
            self._timer = asyncio.get_running_loop().call_later(max(0.0, seconds), self.close, expired)

    def close(self, reason: MstarError | None = None) -> None:
        """Close every stream of the call; a stream still iterated then raises `reason` (if any)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for stream in list(self._streams):
            stream.close(reason)


class RunStream:
    """One request as an async iterator of domain events (see the module docstring)."""

    def __init__(self, runner: RequestRunner, spec: RequestSpec, budget: InputBudget, client: str,
                 on_close, on_accepted=lambda accepted: None) -> None:
        self.spec = spec
        self._runner = runner
        self._budget = budget
        self._client = client
        self._on_close = on_close
        self._on_accepted = on_accepted
        self._run: RequestRun | None = None
        self._events: AsyncIterator[Event] | None = None
        self._closed = False
        self._reason: MstarError | None = None

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> Event:
        if self._closed:
            reason, self._reason = self._reason, None
            if reason is not None:
                raise reason
            raise StopAsyncIteration
        if self._run is None:
            try:
                self._run, accepted = self._runner._begin(self.spec, self._budget, self._client)
            except BaseException:
                self.close()
                raise
            self._events = self._runner.metrics.observe(self._run.events(), self.request_id, self.spec.surface)
            self._on_accepted(accepted)
            return accepted
        assert self._events is not None
        try:
            return await anext(self._events)
        except StopAsyncIteration:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._events is not None:
            events, self._events = self._events, None
            await events.aclose()  # type: ignore[attr-defined]  # records an unfinished request as cancelled
        self.close()

    def close(self, reason: MstarError | None = None) -> None:
        """Abort the generation if it still runs and release its admission ticket. Idempotent.
        `reason`: what a reader still iterating gets (once) instead of the end of the stream."""
        if not self._closed:
            self._reason = reason
        self._closed = True
        if self._run is not None:
            self._runner._end(self._run)
        self._on_close(self)
