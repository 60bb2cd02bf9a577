"""Anthropic Messages responses: the message object, the streaming event sequence, errors.

Streaming (`stream: true`) follows Anthropic's documented sequence, every event with an
`event:` line:

    message_start        once admitted, with the input usage
    content_block_start  index 0, an empty text block
    ping                 right after, and whenever the stream would otherwise stay silent
                         (queued, prefilling, a slow step, a tool call held until complete)
    content_block_delta  text_delta per chunk of text
    content_block_stop
    message_delta        stop_reason, stop_sequence, the cumulative output usage
    message_stop

With tools, text that may start a call is held (services/preprocess/tools.py); each call closes
the open block and is a `tool_use` block (content_block_start with empty `input`, one
`input_json_delta` with the arguments, content_block_stop); stop_reason is then `tool_use`.

A failure after the stream started is an `error` event (`{"type": "error", "error": {...}}`); the
stream still ends as every stream does: the open block's content_block_stop, a message_delta
(stop_reason null) with the output usage so far, message_stop. The SDKs raise at the `error`
event and read no further; a raw SSE client still gets the usage and a well-formed end.

Usage follows Anthropic's split: `input_tokens` are the prompt tokens NOT served from the prefix
cache, `cache_read_input_tokens` those that were. The engine reports the cache hit only when the
request ends, so a non-streamed message splits it, while a stream cannot: its message_start
(sent at admission) counts the whole prompt as `input_tokens` with the cache fields null (not
known), and its message_delta carries only the cumulative `output_tokens`, so the two never
disagree and the SDK's final message keeps message_start's input usage.
"""

from __future__ import annotations

import json

from services.common.errors import MstarError
from services.common.finish import FinishReason
from services.preprocess.request import Accepted, Chunk, Complete, Failed, KeepAlive
from services.preprocess.surfaces.anthropic.errors import cancelled_error, error_object
from services.preprocess.surfaces.http import Frame, KeepAlivePacer, sse
from services.preprocess.tools import CallStream, ToolCall
from services.preprocess.tools import parse as parse_calls

STOP_REASONS = {
    FinishReason.END: "end_turn",
    FinishReason.STOP_STRING: "stop_sequence",
    FinishReason.LENGTH: "max_tokens",
    # Anthropic has no "cancelled" stop reason: a cancelled message ends with an error instead.
    FinishReason.CANCELLED: None,
}

def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    """A whole message's usage (the engine's cache hit known)."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def start_usage(prompt_tokens: int) -> dict:
    """message_start's usage: the input at admission, before the engine looked up its prefix cache."""
    return {"input_tokens": prompt_tokens, "cache_creation_input_tokens": None,
            "cache_read_input_tokens": None, "output_tokens": 0}


PING = sse({"type": "ping"}, "ping")


def tool_use_id(call: ToolCall) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def tool_use_block(call: ToolCall, with_input: bool = True) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call), "name": call.name,
            "input": json.loads(call.arguments) if with_input else {}}


def stop_reason(done: Complete, called: bool) -> str | None:
    reason = STOP_REASONS[done.finish_reason]
    return "tool_use" if called and reason == "end_turn" else reason


def message(msg_id: str, model: str, text: str, done: Complete, tool_calls: bool = False) -> dict:
    """The whole message object of a non-streamed reply (also the snapshot a stream adds up to)."""
    calls: tuple[ToolCall, ...] = ()
    if tool_calls:
        parsed = parse_calls(text)
        text, calls = parsed.content, parsed.calls
    content = [{"type": "text", "text": text}] if text or not calls else []
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content + [tool_use_block(c) for c in calls],
        "stop_reason": stop_reason(done, bool(calls)),
        "stop_sequence": done.stop_reason or None,
        "usage": usage(done.prompt_tokens, done.cached_prompt_tokens, done.completion_tokens),
    }


class MessageStream:
    """Domain events of one request → the SSE frames of Anthropic's event sequence."""

    def __init__(self, model: str, keepalive_s: float, tool_calls: bool = False) -> None:
        self.model = model
        self.ended = False
        self.parser = CallStream() if tool_calls else None
        self.keepalives = KeepAlivePacer(keepalive_s, PING)
        self.block = 0  # index of the last block started
        self.block_open = True
        self.calls = 0
        self.output_tokens = 0  # so far (a failure's message_delta)

    def on_event(self, event) -> list[Frame]:
        return self.keepalives.pace(self._frames(event), isinstance(event, KeepAlive))

    def _frames(self, event) -> list[Frame]:
        if isinstance(event, Accepted):
            return self._start(event)
        if isinstance(event, Chunk):
            self.output_tokens += len(event.token_ids)
            if not event.text:
                return []
            if self.parser is None:
                return self._text(event.text)
            text, calls = self.parser.feed(event.text)
            return self._text(text) + [f for call in calls for f in self._call(call)]
        if isinstance(event, Complete):
            return self._finish(event)
        if isinstance(event, Failed):
            return self.error(event.error)
        return []

    def _start(self, accepted: Accepted) -> list[Frame]:
        start = {
            "id": "msg_" + accepted.request_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": start_usage(accepted.prompt_tokens),
        }
        block = {"type": "text", "text": ""}
        return [
            sse({"type": "message_start", "message": start}, "message_start"),
            sse({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start"),
            PING,
        ]

    def _text(self, text: str) -> list[Frame]:
        if not text:
            return []
        frames = []
        if not self.block_open:
            self.block += 1
            self.block_open = True
            frames.append(sse({"type": "content_block_start", "index": self.block,
                               "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        delta = {"type": "text_delta", "text": text}
        return frames + [sse({"type": "content_block_delta", "index": self.block, "delta": delta},
                             "content_block_delta")]

    def _call(self, call: ToolCall) -> list[Frame]:
        frames = self._close_block()
        self.block += 1
        self.calls += 1
        delta = {"type": "input_json_delta", "partial_json": call.arguments}
        return frames + [
            sse({"type": "content_block_start", "index": self.block,
                 "content_block": tool_use_block(call, with_input=False)}, "content_block_start"),
            sse({"type": "content_block_delta", "index": self.block, "delta": delta}, "content_block_delta"),
            sse({"type": "content_block_stop", "index": self.block}, "content_block_stop"),
        ]

    def _close_block(self) -> list[Frame]:
        if not self.block_open:
            return []
        self.block_open = False
        return [sse({"type": "content_block_stop", "index": self.block}, "content_block_stop")]

    def _finish(self, done: Complete) -> list[Frame]:
        if done.finish_reason is FinishReason.CANCELLED:
            return self._end_in_error(cancelled_error(), done.completion_tokens)
        frames = self._text(self.parser.finish()) if self.parser is not None else []
        delta = {"stop_reason": stop_reason(done, self.calls > 0), "stop_sequence": done.stop_reason or None}
        return [*frames, *self._end(delta, done.completion_tokens)]

    def error(self, err: MstarError) -> list[Frame]:
        return self._end_in_error(error_object(err), self.output_tokens)

    def _end_in_error(self, error: dict, output_tokens: int) -> list[Frame]:
        """The error event, then the end every stream has (what was held back is dropped)."""
        return [sse(error, "error"), *self._end({"stop_reason": None, "stop_sequence": None}, output_tokens)]

    def _end(self, delta: dict, output_tokens: int) -> list[Frame]:
        self.ended = True
        return [
            *self._close_block(),
            sse({"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}},
                "message_delta"),
            sse({"type": "message_stop"}, "message_stop"),
        ]
