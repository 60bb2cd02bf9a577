"""The OpenAI RPCs (CreateChatCompletion, CreateCompletion) as thin functions over `run`.

    async for body in chat_completions(request_body, context, run, model_name=...):
        yield body

`run(PreprocessInput, context)` is an async iterator of GenerateStreamResponse events — exactly
what InferenceService.GenerateStream yields — so admission, tokenization, stop strings and
cancellation stay in one place. This module only parses, fans out n choices and renders.

Status rule: until the first byte is yielded, any error ends the call with a google.rpc.Status
(Envoy maps it to the HTTP status and deploy/envoy/openai_errors.lua reshapes the body into an
OpenAI error). After the first byte (stream: first keep-alive or delta), a failure becomes an
in-band `data: {"error": ...}` frame followed by `data: [DONE]`. Non-streaming responses send
nothing until the whole result is known, so their failures always get a real HTTP status.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from google.api import httpbody_pb2

from services.common import errors
from services.common.metrics import timing_dict, timing_metadata
from services.preprocess.openai import render
from services.preprocess.openai.convert import preprocess_input, token_logprobs
from services.preprocess.openai.fanout import Run, merged
from services.preprocess.openai.render import Envelope, TokenLogprob
from services.preprocess.openai.request import CHAT, COMPLETION, OpenAIRequest, parse


def default_token_text(token_id: int) -> str:
    # Used for logprobs when the caller has no tokenizer at hand (vLLM's "token_id:N" spelling).
    return f"token_id:{token_id}"


@dataclass
class Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    sent_first: bool = False
    text_offset: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # RequestComplete.timings, in ms


async def chat_completions(
    body: httpbody_pb2.HttpBody, context, run: Run, **options
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    async for out in _serve(CHAT, body, context, run, **options):
        yield out


async def completions(
    body: httpbody_pb2.HttpBody, context, run: Run, **options
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    async for out in _serve(COMPLETION, body, context, run, **options):
        yield out


async def _serve(
    kind: str,
    body: httpbody_pb2.HttpBody,
    context,
    run: Run,
    *,
    model_name: str = "",
    token_text: Callable[[int], str] | None = None,
    token_bytes: Callable[[int], bytes] | None = None,
    keep_alive: bool = True,
    request_id_prefix: str = "",
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    try:
        req = parse(kind, body.data, body.content_type)
    except errors.MstarError as err:
        await errors.abort(context, err)
        return
    inputs = [preprocess_input(req, i) for i in range(req.n)]
    stream = _Stream(req, token_text or default_token_text, token_bytes, keep_alive, model_name, request_id_prefix)
    events = merged(run, inputs, context)
    try:
        async for index, event in events:
            for frame in stream.on_event(index, event):
                yield frame
            if stream.failure is not None and not stream.started:
                await errors.abort(context, stream.failure)
                return
            if stream.failure is not None:
                return
        if not req.stream and stream.first_complete is not None:
            # A non-streamed reply is one body at the end: its timing breakdown can go first, as
            # headers (Envoy passes initial metadata through as x-mstar-* response headers).
            await context.send_initial_metadata(timing_metadata(stream.first_complete))
        for frame in stream.on_end():
            yield frame
    except errors.MstarError as err:  # raised by `run` instead of aborting itself
        if stream.started:
            yield stream.error_frame(err)
            yield stream._body(render.DONE)
        else:
            await errors.abort(context, err)
    finally:
        await events.aclose()


class _Stream:
    """Turns GenerateStreamResponse events into HttpBody frames (SSE) or one JSON response."""

    def __init__(
        self, req: OpenAIRequest, token_text, token_bytes, keep_alive: bool, model_name: str, prefix: str
    ) -> None:
        self.req = req
        self.token_text = token_text
        self.token_bytes = token_bytes  # the tokenizer's, for logprob bytes (None: the text's)
        self.keep_alive = keep_alive
        self.choices = [Choice() for _ in range(req.n)]
        self.env = Envelope(
            id="", created=int(time.time()), model=req.model or model_name, chat=req.kind == CHAT
        )
        self.prefix = prefix or ("chatcmpl-" if req.kind == CHAT else "cmpl-")
        self.started = False
        self.failure: errors.MstarError | None = None
        self.first_complete = None  # choice 0's RequestComplete (timings for headers)

    def _body(self, data: bytes) -> httpbody_pb2.HttpBody:
        self.started = True
        ctype = render.SSE_CONTENT_TYPE if self.req.stream else render.JSON_CONTENT_TYPE
        return httpbody_pb2.HttpBody(content_type=ctype, data=data)

    def on_event(self, index: int, event) -> list[httpbody_pb2.HttpBody]:
        kind = event.WhichOneof("event")
        choice = self.choices[index]
        if kind == "accepted":
            if not self.env.id:  # the first choice's request id names the whole response
                self.env.id = self.prefix + event.accepted.request_id
            choice.prompt_tokens = event.accepted.prompt_tokens
        elif kind == "keep_alive":
            if self.req.stream and self.keep_alive:
                return [self._body(render.KEEP_ALIVE)]
        elif kind == "chunk":
            return self._on_chunk(index, choice, event.chunk)
        elif kind == "complete":
            return self._on_complete(index, choice, event.complete)
        elif kind == "failed":
            failed = event.failed
            self.failure = errors.MstarError(
                errors.from_code(failed.code), failed.reason or "FAILED", failed.message
            )
            return [self.error_frame(self.failure), self._body(render.DONE)] if self.started else []
        return []

    def _on_chunk(self, index: int, choice: Choice, chunk) -> list[httpbody_pb2.HttpBody]:
        entries = token_logprobs(chunk) if self.req.sampling.logprobs is not None else []
        choice.text.append(chunk.text)
        choice.logprobs.extend(entries)
        if not self.req.stream or (not chunk.text and not entries):
            return []
        first = not choice.sent_first
        choice.sent_first = True
        delta = self.env.delta_choice(index, chunk.text, first, None, self._logprobs(entries, choice))
        choice.text_offset += len(chunk.text)
        return [self._body(render.sse(self.env.chunk([delta], None, self.req.include_usage)))]

    def _on_complete(self, index: int, choice: Choice, complete) -> list[httpbody_pb2.HttpBody]:
        choice.finish = render.finish_reason(complete.finish_reason)
        u = complete.usage
        choice.prompt_tokens = u.prompt_tokens or choice.prompt_tokens
        choice.cached_tokens = u.cached_prompt_tokens
        choice.completion_tokens = u.completion_tokens
        choice.timings = timing_dict(complete)
        if index == 0:
            self.first_complete = complete
        if not self.req.stream:
            return []
        first = not choice.sent_first
        choice.sent_first = True
        last = self.env.delta_choice(index, "", first, choice.finish, None)
        return [self._body(render.sse(self.env.chunk([last], None, self.req.include_usage)))]

    def _logprobs(self, entries: list[TokenLogprob], choice: Choice) -> dict | None:
        if self.req.sampling.logprobs is None:
            return None
        if self.env.chat:
            return render.chat_logprobs(entries, self.token_text, self.token_bytes)
        return render.completion_logprobs(entries, self.token_text, choice.text_offset)

    def _usage(self) -> dict:
        first = self.choices[0]
        usage = render.usage(
            first.prompt_tokens, sum(c.completion_tokens for c in self.choices), first.cached_tokens
        )
        # mstar's extension: where the time went (queue, prefill, ttft, decode, e2e; ms), per choice.
        usage["mstar_timings"] = [c.timings for c in self.choices]
        return usage

    def on_end(self) -> list[httpbody_pb2.HttpBody]:
        if self.req.stream:
            frames = []
            if self.req.include_usage:
                frames.append(self._body(render.sse(self.env.chunk([], self._usage(), True))))
            return [*frames, self._body(render.DONE)]
        choices = []
        for i, c in enumerate(self.choices):
            lp = None
            if self.req.sampling.logprobs is not None:
                c.text_offset = 0
                lp = self._logprobs(c.logprobs, c)
            choices.append(self.env.final_choice(i, "".join(c.text), c.finish or "stop", lp))
        return [self._body(render.dumps(self.env.response(choices, self._usage())))]

    def error_frame(self, err: errors.MstarError) -> httpbody_pb2.HttpBody:
        field_name = err.field_violations[0].field if err.field_violations else None
        return self._body(
            render.sse(render.error_object(err.message, err.http_status, err.reason, field_name))
        )
