"""OpenAI response objects and Server-Sent-Events framing (plain dicts and bytes, no protobuf).

Chunks are `data: <json>\n\n`; the stream ends with `data: [DONE]\n\n`; `: keep-alive\n\n` is an
SSE comment (ignored by every SSE parser, including the openai client) written whenever the stream
would otherwise stay silent (queued, prefilling, a slow step, a tool call held until complete) so
proxies and clients see the connection is alive. A failure after the stream started is an in-band
`data: {"error": {...}}` frame, then `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.common.errors import MstarError
from services.common.finish import FinishReason
from services.preprocess.surfaces.http import Frame, sse, sse_frame
from services.preprocess.surfaces.openai.errors import error_object
from services.preprocess.tools import ToolCall

DONE = sse_frame(b"data: [DONE]\n\n")

def error_frames(err: MstarError) -> list[Frame]:
    """A failure after the stream started: an in-band error chunk, then [DONE]."""
    return [sse(error_object(err)), DONE]


# OpenAI's finish_reason, which clients parse as an enum of "stop", "length", "content_filter",
# "tool_calls" (and legacy "function_call"): no other value may appear. A request stopped before
# its natural end (a Cancel by id, the end of a drain) is "stop": generation stopped before
# max_tokens, which is what "stop" means to a client. A failed request is an error object instead.
FINISH_REASONS = {
    FinishReason.END: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "stop",
}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass
class TokenLogprob:
    """One generated token's logprob and its top alternatives (ids; rendered as text here)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]


def chat_logprobs(entries: list[TokenLogprob], text: TokenText, token_bytes: TokenBytes) -> dict:
    """`bytes` are the token's own bytes: a token holding part of a UTF-8 character (byte-fallback
    tokens, a cut emoji) has no text of its own, and its `token` shows U+FFFD, but its `bytes` are
    what the client concatenates to rebuild the text, as OpenAI documents."""

    def item(token_id: int, logprob: float) -> dict:
        return {"token": text(token_id), "logprob": logprob, "bytes": list(token_bytes(token_id))}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries
        ]
    }


def completion_logprobs(entries: list[TokenLogprob], text: TokenText, text_offset: int) -> dict:
    tokens = [text(e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{text(t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def tool_call_object(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@dataclass
class Envelope:
    """The fields every response object of one request shares."""

    id: str
    created: int
    model: str
    chat: bool

    def chunk(self, choices: list[dict], usage_value: dict | None = None, with_usage: bool = False) -> dict:
        obj = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if with_usage:  # OpenAI sends "usage": null on every chunk but the last when usage is on
            obj["usage"] = usage_value
        return obj

    def response(self, choices: list[dict], usage_value: dict) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_value,
        }

    def delta_choice(
        self, index: int, text: str, first: bool, finish: str | None, logprobs: dict | None
    ) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def tool_call_deltas(self, index: int, call_index: int, call: ToolCall, first: bool) -> list[dict]:
        """One call as two streamed fragments: id, type and name, then the arguments."""
        head = {"index": call_index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        opening = {"role": "assistant", "content": None} if first else {}
        return [
            {"index": index, "delta": {**opening, "tool_calls": [head]}, "logprobs": None, "finish_reason": None},
            {"index": index, "delta": {"tool_calls": [{"index": call_index, "function": {"arguments": call.arguments}}]},
             "logprobs": None, "finish_reason": None},
        ]

    def final_choice(self, index: int, text: str, finish: str, logprobs: dict | None,
                     calls: tuple[ToolCall, ...] = ()) -> dict:
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if calls:
                message["content"] = text if text.strip() else None
                message["tool_calls"] = [tool_call_object(c) for c in calls]
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
