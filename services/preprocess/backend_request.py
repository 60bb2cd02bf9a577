"""One request's handle on the generation side (services/preprocess/backend.py owns the stream
it runs on): its event queue, append, abort, and the failover that may move it to another stream.

The arrow runs one way: the stream imports and drives its requests; a request knows its stream
only as a `RequestStream` (what it may ask of it), never its module.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from typing import Protocol

from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.v1 import messages_pb2 as pb

from services.common import tracing
from services.common.errors import Code, MstarError
from services.preprocess.backend_events import (
    BackendEvent,
    BackendFailed,
    BackendFinished,
    TensorResult,
    TokenStep,
)


class RequestStream(Protocol):
    """What a request asks of the stream it runs on (services/preprocess/backend.py's GenerationBackend)."""

    def send(self, frame: gen_pb2.ClientFrame) -> None: ...

    def is_running(self, key: str) -> bool: ...

    def forget(self, key: str) -> bool:
        """Drop `key` from the stream's requests; False if it was not there (already ended)."""
        ...


def _abort(stream: RequestStream, key: str, reason: str) -> None:
    stream.send(gen_pb2.ClientFrame(abort=gen_pb2.Abort(request_id=key, reason=reason[:256])))


class BackendRequest:
    """One request's handle on the generation side: its event queue, append and abort.

    The handle outlives the stream it started on. When that stream breaks (or the engine ends the
    request with UNAVAILABLE), `lost` offers it to the `failover` hook (set by the replica pool).
    The contract's retry rule allows running it again only if no token came back yet
    (`tokens_received`); then the pool re-submits it, with every prompt token received so far, on
    another replica under a new key, and the reader of `queue` never notices. Otherwise it fails.
    When the stream only goes silent (`stalled`), a request that cannot move keeps waiting.
    """

    def __init__(
        self, request_id: str, prompt_ids: list[int], model_kwargs: pb.ModelKwargs, input_open: bool, queue_size: int,
        image_tiles: tuple[bytes, ...] = (),
    ) -> None:
        self.request_id = request_id
        # A vision-language prompt's image tiles, uint8 [3, S, S] each, in prompt order: sent with
        # every attempt's start (a failover re-sends them with the prompt).
        self.image_tiles = image_tiles
        # Every prompt token so far (start + appends): what a failover re-submits. int32 array:
        # vocabulary ids, 4 bytes each instead of a Python int object per token.
        self.prompt_ids = array("i", prompt_ids)
        self.input_open = input_open
        self.model_kwargs = model_kwargs
        # The stream is shared by many traces: each request carries its own (the RPC's span, taken
        # here, in the RPC's context, and sent again with every failover).
        self.trace_context = tracing.inject()
        self.backend: RequestStream | None = None  # the stream of the current attempt
        self.key = ""  # the short per-stream key of the current attempt ("r1f")
        self.tried: list[str] = []  # replica addresses of every attempt, first to current
        # (request, error, may_stay) -> moved; may_stay: not moving is no failure (a silent replica)
        self.failover: Callable[[BackendRequest, MstarError, bool], bool] | None = None
        self.tokens_received = False
        # queue_size events at most, plus one slot kept for the request's terminal event, so a
        # reader that is behind still gets every token and then the finish, never a finish alone.
        self._max_pending = queue_size
        self.queue: asyncio.Queue[BackendEvent] = asyncio.Queue(maxsize=queue_size + 1)
        self.ended = False

    def append(self, token_ids: list[int], end: bool, max_tokens: int | None = None) -> None:
        """More prompt tokens; the last ones (`end`) may bring the max_tokens resolved now that the
        prompt is complete, which a failover's re-submission then carries too."""
        if self.ended:
            return
        self.prompt_ids.extend(token_ids)
        self.input_open = self.input_open and not end
        if max_tokens is not None:
            self.model_kwargs.sampling.max_tokens = max_tokens
        chunk = pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=token_ids))
        append = pb.ClientAppend(
            request_id=self.key, chunks=[chunk], ends=[pb.MODALITY_TOKENS] if end else []
        )
        self.backend.send(gen_pb2.ClientFrame(client_append=append, max_tokens=max_tokens))

    def stop_early(self, reason: str) -> None:
        """Stop generating but keep listening: the engine ends the request with a RequestComplete
        (cancelled) that still carries its usage and timings (a stop string matched here)."""
        if not self.ended and self.backend is not None and self.backend.is_running(self.key):
            _abort(self.backend, self.key, reason)

    def abort(self, reason: str) -> None:
        """Stop generating for this request. Idempotent; safe from any finally-path."""
        self.detach(reason)
        self.ended = True

    def detach(self, reason: str) -> None:
        """Abort the current attempt on its stream, keeping the handle (failover may move it)."""
        backend = self.backend
        if backend is not None and backend.forget(self.key):
            _abort(backend, self.key, reason)

    def end_locally(self, event: object, reason: str) -> None:
        """Abort in the engine and make `event` the last thing the reader sees (cancel, local
        failure). No-op once the request ended."""
        if self.ended:
            return
        self.abort(reason)
        while self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(event)

    def lost(self, error: MstarError) -> None:
        """The current replica lost this request (its stream broke, or the engine ended it with
        UNAVAILABLE): run it elsewhere if the failover hook can, else fail it with `error`."""
        if self.ended:
            return
        if self.failover is not None and self.failover(self, error, False):
            return
        self.deliver(BackendFailed(error))

    def stalled(self, error: MstarError) -> None:
        """The current replica went silent (a frozen process): move to another one if the retry
        rule allows it now, else stay and wait for this one to speak again (a deadline, or the
        stream breaking, still ends the request)."""
        if self.ended or self.failover is None:
            return
        backend, key = self.backend, self.key
        if self.failover(self, error, True) and backend is not None and backend.forget(key):
            # Read when (if) the frozen replica resumes: it frees what it held for this attempt.
            _abort(backend, key, "moved: replica stalled")

    def deliver(self, event: BackendEvent) -> None:
        """Queue an event; a request whose reader fell `queue_size` events behind is failed
        (bounded memory per request: a stalled client must not grow our buffers)."""
        if self.ended:
            return
        terminal = isinstance(event, BackendFinished | BackendFailed)
        if not terminal and self.queue.qsize() >= self._max_pending:
            self.abort("client too slow")
            event, terminal = BackendFailed(
                MstarError(Code.RESOURCE_EXHAUSTED, "SLOW_CONSUMER", "the client did not read its output in time")
            ), True
            while not self.queue.empty():  # the backlog is replaced by the error the reader sees next
                self.queue.get_nowait()
        if terminal:
            self.ended = True
        elif isinstance(event, TokenStep | TensorResult):
            self.tokens_received = True  # from now on a lost stream fails the request (no retry)
        self.queue.put_nowait(event)  # a terminal event always fits: the spare slot
