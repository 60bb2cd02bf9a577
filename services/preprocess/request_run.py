"""One request from admission to its terminal event (the domain core of the servicer).

`start()` validates, builds the prompt, checks it fits, takes an admission ticket and submits the
tokens to the generation backend; every error before that point is raised (so the RPC can end
with a status BEFORE anything is streamed). `events()` then turns backend token steps into text
chunks (detokenizer -> stop matcher) and ends with exactly one Complete or Failed. `close()` is
the finally-path: it aborts the generation if it is still running and releases the ticket;
it is idempotent, so cancel, disconnect, deadline and normal completion can all call it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from services.common import hop_trace
from services.common.errors import Code, MstarError, failed_precondition, renamed
from services.common.finish import FinishReason
from services.common.prompt_fit import check_prompt_fits
from services.preprocess import limits as caps
from services.preprocess.admission import Admission, Ticket
from services.preprocess.backend_events import (
    BackendFailed,
    BackendFinished,
    Heartbeat,
    TensorResult,
    TokenStep,
)
from services.preprocess.backend_request import BackendRequest
from services.preprocess.detokenizer import Detokenizer
from services.preprocess.input_names import input_names
from services.preprocess.limits import InputBudget, Limits
from services.preprocess.media import FileReader
from services.preprocess.model import ModelSpec
from services.preprocess.prompt import PromptBuilder
from services.preprocess.replica_pool import ReplicaPool
from services.preprocess.request import (
    Accepted,
    AppendSpec,
    Chunk,
    Complete,
    Event,
    Failed,
    KeepAlive,
    Profile,
    RequestSpec,
    Tensor,
)
from services.preprocess.stop import StopMatcher


@dataclass
class Deps:
    """What every request needs from the server."""

    model: ModelSpec
    backend: ReplicaPool  # every generation replica; submit() routes and starts a request
    admission: Admission
    limits: Limits
    files: FileReader
    keepalive_s: float = 2.0
    # An open input that receives nothing for this long fails the request: otherwise a client
    # that forgets to end its input holds an admission slot until Envoy's max stream duration.
    input_idle_s: float = 60.0
    # However often it appends, no input stays open longer than this (an append every 20 s would
    # otherwise reset the idle timer forever and hold the slot: docs/http.md "Fair admission").
    input_lifetime_s: float = 300.0


# How long a stop-string finish waits for the engine's own end of the request (normally one step).
_STOP_END_WAIT_S = 2.0


class _Cancelled:
    """Queued into the backend queue by cancel(): ends events() with finish_reason cancelled."""


class RequestRun:
    def __init__(self, spec: RequestSpec, deps: Deps, budget: InputBudget, client: str = "") -> None:
        self.spec = spec
        self.request_id = spec.request_id
        self.client = client  # the admission key (client.py): shares are per client
        self._deps = deps
        self._budget = budget
        self._prompt = PromptBuilder(deps.model, deps.files)
        self._dequeue_time = time.time()
        self._opened = self._last_input = time.monotonic()
        self._input_closed: float | None = None
        self._preprocess_finish: float | None = None
        self._uploads = [spec.upload_bytes]
        self._ticket: Ticket | None = None
        self._backend: BackendRequest | None = None
        self._max_tokens = 0
        self._warnings: tuple[str, ...] = ()
        self.finished = False

    @property
    def input_done(self) -> bool:
        return self._prompt.input_done

    @property
    def prompt_tokens(self) -> int:
        return self._prompt.num_tokens

    @property
    def input_infos(self) -> list:
        """Each prompt input so far: modality, bytes, tokens (DataWorkerProfile's, the metrics')."""
        return self._prompt.input_infos

    @property
    def input_open_s(self) -> float | None:
        """How long this request's input was open (so far); None for a one-shot request."""
        if not self.spec.open_inputs:
            return None
        return (self._input_closed or time.monotonic()) - self._opened

    @property
    def ended(self) -> bool:
        """True once the request's terminal event is decided (queued or already delivered)."""
        return self.finished or (self._backend is not None and self._backend.ended)

    def start(self) -> Accepted:
        """Validate, build the prompt, admit, submit (the runner already charged its input budget)."""
        d, s = self._deps, self.spec
        caps.validate_sampling(s.sampling, d.limits, d.model.tokenizer.vocab_size, s.surface)
        caps.validate_constraint(s.sampling.structured_output, s.field_renames)
        caps.validate_extra(s.extra_keys)
        if s.embedding is not None:
            caps.check_embedding(s.embedding, d.model.hidden_size, s.surface)
        ids = self._prompt.start(s)
        names = input_names(s.surface)
        self._check_fits(names.messages if s.messages else names.text)
        self._resolve_max_tokens()
        self._ticket = d.admission.admit(self.prompt_tokens, self.client, input_open=not self.input_done)
        try:
            self._backend = d.backend.submit(
                self.request_id, ids, s.sampling, self._max_tokens, input_open=not self.input_done,
                embedding=s.embedding, image_tiles=tuple(self._prompt.image_tiles),
            )
        except MstarError:
            self._ticket.release()
            raise
        if self.input_done:
            self._preprocess_finish = time.time()
        return Accepted(
            self.request_id, s.client_request_id, self.prompt_tokens, self._max_tokens, self._warnings
        )

    def append(self, spec: AppendSpec, charged: bool = False) -> None:
        """More input. Raises FAILED_PRECONDITION, leaving the request untouched, once the input
        ended (or the request did); any later error also fails the request (`ended` turns True:
        part of the input may already be committed). `charged`: the caller already counted the
        message against the stream's InputBudget (a Session counts every message on arrival)."""
        if self.finished:
            raise failed_precondition(f"request {self.request_id} has finished", "REQUEST_FINISHED")
        if self.input_done:
            raise failed_precondition(f"the input of request {self.request_id} has ended", "INPUT_ENDED")
        self._uploads.append(spec.upload_bytes)
        self._last_input = time.monotonic()
        before = self.prompt_tokens
        try:
            if not charged:
                self._budget.charge(spec.upload_bytes, is_append=True)
            ids = self._prompt.append(spec.parts, spec.ends)
            self._check_fits("append.chunks")
        except MstarError as err:
            # Part of the input may already be committed: the request cannot continue coherently.
            self._fail(err)
            raise
        finally:
            if self._ticket is not None:
                self._ticket.add_tokens(self.prompt_tokens - before)
        if self._backend is not None and (ids or self.input_done):
            resolved = self._resolve_max_tokens() if self.input_done else None
            self._backend.append(ids, end=self.input_done, max_tokens=resolved)
        if self.input_done:
            self._preprocess_finish = time.time()
            self._input_closed = time.monotonic()
            if self._ticket is not None:
                self._ticket.close_input()

    def _resolve_max_tokens(self) -> int | None:
        """The ONE resolution of max_tokens (limits.effective_max_tokens: cap, default, the clamp to
        the context and its warning, naming the client's field), when the prompt is complete; an
        open input's start resolves against no prompt and its end again, sent with the last append
        (the engine checks it, never clamps). None for an embedding, which generates nothing."""
        s, d = self.spec, self._deps
        if s.embedding is not None:
            return None
        self._max_tokens, warnings = caps.effective_max_tokens(
            s.sampling.max_tokens, self.prompt_tokens if self.input_done else 0, d.model.context_length, d.limits,
            caps.sent_name(s.sampling, "max_tokens", s.surface, bare=True))
        self._warnings += tuple(w for w in warnings if w not in self._warnings)
        return self._max_tokens

    def cancel(self) -> bool:
        """Stop this request; it ends with finish_reason "cancelled". False if already over."""
        if self.finished or self._backend is None or self._backend.ended:
            return False
        self._backend.end_locally(_Cancelled(), "cancelled by the client")
        return True

    def _fail(self, err: MstarError) -> None:
        if self._backend is not None:
            self._backend.end_locally(BackendFailed(err), err.reason)

    def _input_wait_s(self) -> float:
        """How long events() may wait before the open input must be checked again."""
        if self.input_done or self._backend is None or self._backend.ended:
            return self._deps.keepalive_s
        now, d = time.monotonic(), self._deps
        due = min(self._last_input + d.input_idle_s, self._opened + d.input_lifetime_s)
        return max(0.0, min(d.keepalive_s, due - now))

    def _fail_if_input_expired(self) -> None:
        """An open input that went quiet (idle) or stayed open too long (lifetime) ends the request
        and frees its admission slot."""
        if self.input_done or self.finished or self._backend is None or self._backend.ended:
            return
        now, d = time.monotonic(), self._deps
        if now - self._opened >= d.input_lifetime_s:
            self._fail(MstarError(
                Code.DEADLINE_EXCEEDED, "INPUT_OPEN_TOO_LONG",
                f"the input stayed open for {d.input_lifetime_s:.0f} s, the most any request may keep it "
                f"open however often it appends (end it with `ends`)",
            ))
        elif now - self._last_input >= d.input_idle_s:
            self._fail(MstarError(
                Code.DEADLINE_EXCEEDED, "INPUT_IDLE_TIMEOUT",
                f"no input for {now - self._last_input:.0f} s while the input of request {self.request_id} "
                f"is open (end it with `ends`; limit {d.input_idle_s:.0f} s)",
            ))

    def close(self) -> None:
        """Finally-path: abort if still generating, release the admission ticket."""
        self.finished = True
        if self._backend is not None:
            self._backend.abort("request closed")
        if self._ticket is not None:
            self._ticket.release()

    async def events(self) -> AsyncIterator[Event]:
        rid = self.request_id
        tok = self._deps.model.tokenizer
        detok = Detokenizer(tok.token_bytes)
        stops = StopMatcher(self.spec.sampling.stop, self.spec.sampling.include_stop)
        chunks, completion, sent_profile = 0, 0, False
        tensors: list[Tensor] = []
        num_tensors = 0
        postprocess_s = 0.0  # detokenizing and stop matching, summed over the request
        token_ids: list[int] = []
        logprobs: list = []
        queue = self._backend.queue
        while True:
            if not sent_profile and self._preprocess_finish is not None:
                sent_profile = True
                yield self._profile()
            self._fail_if_input_expired()  # queues the failure, which is read next
            try:
                async with asyncio.timeout(self._input_wait_s()):  # never wait_for: see pyproject's ban
                    first = await queue.get()
            except TimeoutError:
                self._fail_if_input_expired()
                if queue.empty():
                    yield KeepAlive(rid)
                continue
            batch = [first]
            while not queue.empty():  # coalesce whatever piled up into one chunk
                batch.append(queue.get_nowait())
            text, stop, terminal = "", None, None
            started = time.perf_counter()
            for i, event in enumerate(batch):
                if isinstance(event, TokenStep):
                    completion += 1
                    token_ids.append(event.token_id)
                    if event.logprobs is not None:
                        logprobs.append(event.logprobs)
                    result = stops.feed(detok.feed([event.token_id]))
                    text += result.text
                    if hop_trace.ON:
                        hop_trace.mark("pp_detok", rid, completion - 1)
                    if result.stop is not None:
                        stop = result.stop
                        waited = time.perf_counter()
                        terminal = await self._end_on_stop_string(batch[i + 1:], queue)
                        started += time.perf_counter() - waited  # the engine's reply is not postprocessing
                        break
                elif isinstance(event, Heartbeat):
                    continue
                elif isinstance(event, TensorResult):
                    tensors.append(Tensor(rid, event.data, event.shape))
                else:
                    terminal = event
                    break
            if isinstance(terminal, BackendFinished) and stop is None:
                result = stops.feed(detok.finish())
                text += result.text
                stop = result.stop
                text += stops.finish()
            postprocess_s += time.perf_counter() - started
            if text:
                if hop_trace.ON:  # chunk number -> the last token it carries
                    hop_trace.mark("pp_chunk", rid, chunks, completion - 1)
                yield Chunk(rid, chunks, text, tuple(token_ids), tuple(logprobs))
                chunks += 1
                token_ids, logprobs = [], []
            for tensor in tensors:
                yield tensor
            num_tensors += len(tensors)
            tensors.clear()
            if terminal is None:
                if not any(isinstance(e, TokenStep | TensorResult) for e in batch):
                    yield KeepAlive(rid)
                continue
            self.finished = True
            if hop_trace.ON:
                hop_trace.flush()
            if isinstance(terminal, BackendFailed):
                yield Failed(rid, renamed(terminal.error, self.spec.field_renames))
                return
            reason = (
                FinishReason.CANCELLED
                if isinstance(terminal, _Cancelled)
                else (FinishReason.STOP_STRING if stop else terminal.finish_reason)
            )
            backend = terminal if isinstance(terminal, BackendFinished) else BackendFinished(reason)
            yield Complete(
                request_id=rid,
                finish_reason=reason,
                stop_reason=stop or "",
                prompt_tokens=self.prompt_tokens,
                cached_prompt_tokens=backend.cached_prompt_tokens,
                completion_tokens=completion,
                chunks=chunks,
                tensors=num_tensors,
                timings_ms=backend.timings_ms,
                conductor_times=backend.conductor_times,
                warnings=self._warnings,
                node_timings_ms=self._node_timings_ms(backend, postprocess_s),
                rx_messages=len(self._uploads),
                rx_bytes=sum(self._uploads),
            )
            return

    async def _end_on_stop_string(self, rest: list, queue: asyncio.Queue) -> BackendFinished:
        """A stop string matched here, which the engine cannot know: stop it, and wait (about one
        step) for its RequestComplete, whose usage and timings are the request's real ones. Tokens
        it made meanwhile are dropped. If none comes in time (the stream broke), zeros."""
        self._backend.stop_early("stop string matched")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STOP_END_WAIT_S
        pending = list(rest)
        while True:
            event = pending.pop(0) if pending else None
            if event is None:
                try:
                    async with asyncio.timeout_at(deadline):
                        event = await queue.get()
                except TimeoutError:
                    self._backend.abort("stop string matched")
                    return BackendFinished(FinishReason.STOP_STRING)
            if isinstance(event, BackendFinished):
                return replace(event, finish_reason=FinishReason.STOP_STRING)
            if isinstance(event, BackendFailed):
                return BackendFinished(FinishReason.STOP_STRING)

    def _node_timings_ms(self, backend: BackendFinished, postprocess_s: float) -> dict[str, float]:
        """The request's path through the services: preprocessing (validation, template,
        tokenization, until the input was complete), generation (the conductor's arrival to
        finish) and postprocessing (detokenizing and stop matching)."""
        out = {}
        if self._preprocess_finish is not None:
            out["preprocess"] = max(0.0, (self._preprocess_finish - self._dequeue_time) * 1000)
        if "e2e_ms" in backend.timings_ms:
            out["generation"] = backend.timings_ms["e2e_ms"]
        out["postprocess"] = postprocess_s * 1000
        return out

    def _profile(self) -> Profile:
        return Profile(
            request_id=self.request_id,
            dequeue_time=self._dequeue_time,
            preprocess_finish_time=self._preprocess_finish or time.time(),
            input_infos=tuple(self._prompt.input_infos),
            upload_sizes_bytes=tuple(self._uploads),
        )

    def _check_fits(self, field: str) -> None:
        output_tokens = 0 if self.spec.embedding is not None else 1
        check_prompt_fits(self.prompt_tokens, self._deps.model.context_length, field, output_tokens)
