"""The choices of one OpenAI request: domain events in, SSE frames or one JSON body out.

Streaming: the first chat delta carries `role: "assistant"`, every choice ends with an empty
delta carrying its `finish_reason`, `: keep-alive` comments fill every silence (http.py
KeepAlivePacer: queued, prefilling, a slow step, a tool call held until complete), and with
`stream_options.include_usage` every chunk has `"usage": null` and a last chunk with
`choices: []` carries the usage. Non-streamed: one response object once every choice ended.

With tools, the text is parsed for calls (services/preprocess/tools.py): streamed, text that may
start a call is held until it is one; each call goes out as two `delta.tool_calls` fragments (id,
type and name with empty arguments, then the arguments), as OpenAI streams them. A choice that
made a call and ended naturally has finish_reason "tool_calls".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.errors import MstarError
from services.common.metrics import request_timings
from services.preprocess.request import Accepted, Chunk, Complete, Failed, KeepAlive
from services.preprocess.surfaces.http import SSE_COMMENT_KEEPALIVE, Frame, KeepAlivePacer, json_frame, sse
from services.preprocess.surfaces.openai import render
from services.preprocess.surfaces.openai.render import Envelope, TokenLogprob
from services.preprocess.tools import CallStream, ToolCall
from services.preprocess.tools import parse as parse_calls


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
    timings: dict[str, float] = field(default_factory=dict)  # engine timings, ms
    parser: CallStream | None = None  # with tools
    calls: list[ToolCall] = field(default_factory=list)


def token_logprobs(chunk: Chunk) -> list[TokenLogprob]:
    return [
        TokenLogprob(token_id, lp.logprob, list(zip(lp.top_token_ids, lp.top_logprobs, strict=False)))
        for token_id, lp in zip(chunk.token_ids, chunk.logprobs, strict=False)
    ]


class Choices:
    def __init__(self, *, chat: bool, n: int, stream: bool, include_usage: bool, logprobs: bool,
                 model: str, token_text: Callable[[int], str], token_bytes: Callable[[int], bytes],
                 keepalive_s: float, tool_calls: bool = False) -> None:
        self.stream = stream
        self.keepalives = KeepAlivePacer(keepalive_s, SSE_COMMENT_KEEPALIVE)
        self.include_usage = include_usage
        self.with_logprobs = logprobs
        self.token_text = token_text
        self.token_bytes = token_bytes
        self.choices = [Choice(parser=CallStream() if tool_calls else None) for _ in range(n)]
        self.env = Envelope(id="", created=int(time.time()), model=model, chat=chat)
        self.prefix = "chatcmpl-" if chat else "cmpl-"
        self.failure: MstarError | None = None
        self.first_complete: Complete | None = None  # choice 0's (timing headers)

    def on_event(self, index: int, event) -> list[Frame]:
        frames = self._frames(index, event)
        if not self.stream or isinstance(event, Failed):  # a failure's frames are the endpoint's
            return frames
        return self.keepalives.pace(frames, isinstance(event, KeepAlive))

    def _frames(self, index: int, event) -> list[Frame]:
        choice = self.choices[index]
        if isinstance(event, Accepted):
            if not self.env.id:  # the first admitted choice's request id names the response
                self.env.id = self.prefix + event.request_id
            choice.prompt_tokens = event.prompt_tokens
        elif isinstance(event, Chunk):
            return self._on_chunk(index, choice, event)
        elif isinstance(event, Complete):
            return self._on_complete(index, choice, event)
        elif isinstance(event, Failed):
            self.failure = event.error
        return []

    def _on_chunk(self, index: int, choice: Choice, chunk: Chunk) -> list[Frame]:
        entries = token_logprobs(chunk) if self.with_logprobs else []
        choice.text.append(chunk.text)
        choice.logprobs.extend(entries)
        if not self.stream:
            return []
        text, calls = (chunk.text, []) if choice.parser is None else choice.parser.feed(chunk.text)
        frames = []
        if text or entries:
            frames.append(self._delta(index, choice, text, entries))
        return frames + self._call_frames(index, choice, calls)

    def _delta(self, index: int, choice: Choice, text: str, entries: list[TokenLogprob]) -> Frame:
        first = not choice.sent_first
        choice.sent_first = True
        delta = self.env.delta_choice(index, text, first, None, self._logprobs(entries, choice))
        choice.text_offset += len(text)
        return sse(self.env.chunk([delta], None, self.include_usage))

    def _call_frames(self, index: int, choice: Choice, calls: list[ToolCall]) -> list[Frame]:
        frames = []
        for call in calls:
            first = not choice.sent_first
            choice.sent_first = True
            for delta in self.env.tool_call_deltas(index, len(choice.calls), call, first):
                frames.append(sse(self.env.chunk([delta], None, self.include_usage)))
            choice.calls.append(call)
        return frames

    def _on_complete(self, index: int, choice: Choice, done: Complete) -> list[Frame]:
        choice.finish = render.FINISH_REASONS[done.finish_reason]
        choice.prompt_tokens = done.prompt_tokens or choice.prompt_tokens
        choice.cached_tokens = done.cached_prompt_tokens
        choice.completion_tokens = done.completion_tokens
        choice.timings = request_timings(done)
        if index == 0:
            self.first_complete = done
        if not self.stream:
            return []
        frames = []
        if choice.parser is not None:
            rest = choice.parser.finish()  # an unfinished call (max_tokens) is text after all
            if rest:
                frames.append(self._delta(index, choice, rest, []))
            if choice.calls and choice.finish == "stop":
                choice.finish = "tool_calls"
        first = not choice.sent_first
        choice.sent_first = True
        last = self.env.delta_choice(index, "", first, choice.finish, None)
        return [*frames, sse(self.env.chunk([last], None, self.include_usage))]

    def _logprobs(self, entries: list[TokenLogprob], choice: Choice) -> dict | None:
        if not self.with_logprobs:
            return None
        if self.env.chat:
            return render.chat_logprobs(entries, self.token_text, self.token_bytes)
        return render.completion_logprobs(entries, self.token_text, choice.text_offset)

    def _usage(self) -> dict:
        first = self.choices[0]
        usage = render.usage(first.prompt_tokens, sum(c.completion_tokens for c in self.choices), first.cached_tokens)
        # mstar's extension: where the time went (queue, prefill, ttft, decode, e2e; ms), per choice.
        usage["mstar_timings"] = [c.timings for c in self.choices]
        return usage

    def end(self, headers: tuple[tuple[str, str], ...] = ()) -> list[Frame]:
        if self.stream:
            frames = []
            if self.include_usage:
                frames.append(sse(self.env.chunk([], self._usage(), True)))
            return [*frames, render.DONE]
        choices = []
        for i, c in enumerate(self.choices):
            lp = None
            if self.with_logprobs:
                c.text_offset = 0
                lp = self._logprobs(c.logprobs, c)
            text, calls, finish = "".join(c.text), (), c.finish or "stop"
            if c.parser is not None:
                parsed = parse_calls(text)
                text, calls = parsed.content, parsed.calls
                if calls and finish == "stop":
                    finish = "tool_calls"
            choices.append(self.env.final_choice(i, text, finish, lp, calls))
        return [json_frame(self.env.response(choices, self._usage()), headers)]
