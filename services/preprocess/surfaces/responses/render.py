"""OpenAI Responses objects and the streaming event sequence (plain dicts; no protobuf).

A response has one output item, an assistant `message` with one `output_text` part. Its
`status` follows the domain finish reason: completed (end of turn, stop string), incomplete
(`incomplete_details.reason: max_output_tokens`), cancelled; failed when the request failed.

Streaming: every event has an `event:` line, `type` and a `sequence_number` counting from 0:

    response.created, response.in_progress                 once admitted
    response.output_item.added, response.content_part.added
    response.output_text.delta                              per chunk of text
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed | response.incomplete | response.failed   with the whole response

While queued or prefilling the stream carries `: keep-alive` SSE comments (ignored by clients).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import MstarError
from services.preprocess.finish import FinishReason
from services.preprocess.request import Complete
from services.preprocess.surfaces.http import Frame, sse

STATUS = {
    FinishReason.END: "completed",
    FinishReason.STOP_STRING: "completed",
    FinishReason.LENGTH: "incomplete",
    FinishReason.CANCELLED: "cancelled",
}
TERMINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "cancelled": "response.incomplete", "failed": "response.failed"}


@dataclass
class ResponseState:
    """One response as it runs (and as it is stored)."""

    id: str
    item_id: str
    created_at: int
    model: str
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    store: bool
    previous_response_id: str | None
    metadata: dict[str, str]
    status: str = "in_progress"
    text: str = ""
    usage: dict | None = None
    error: dict | None = None
    incomplete_reason: str | None = None
    sequence: int = field(default=0)

    def finish(self, done: Complete) -> None:
        self.status = STATUS[done.reason]
        if done.reason is FinishReason.LENGTH:
            self.incomplete_reason = "max_output_tokens"
        self.usage = usage(done)

    def fail(self, err: MstarError) -> None:
        self.status = "failed"
        self.error = {"code": err.reason.lower() or "server_error", "message": err.message}

    def item(self) -> dict:
        done = self.status != "in_progress"
        return {
            "id": self.item_id,
            "type": "message",
            "status": ("completed" if self.status == "completed" else "incomplete") if done else "in_progress",
            "role": "assistant",
            "content": [output_text(self.text)] if done else [],
        }

    def object(self) -> dict:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": {"reason": self.incomplete_reason} if self.incomplete_reason else None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": [self.item()] if self.status != "in_progress" and self.status != "failed" else [],
            "parallel_tool_calls": False,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": self.store,
            "temperature": self.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": self.usage,
            "user": None,
            "metadata": self.metadata,
        }


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(done: Complete) -> dict:
    return {
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_prompt_tokens},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


class ResponseStream:
    """A ResponseState's life as SSE frames, each numbered."""

    def __init__(self, state: ResponseState) -> None:
        self.state = state

    def _event(self, kind: str, **fields) -> Frame:
        obj = {"type": kind, "sequence_number": self.state.sequence, **fields}
        self.state.sequence += 1
        return sse(obj, kind)

    def _where(self) -> dict:
        return {"item_id": self.state.item_id, "output_index": 0, "content_index": 0}

    def start(self) -> list[Frame]:
        s = self.state
        return [
            self._event("response.created", response=s.object()),
            self._event("response.in_progress", response=s.object()),
            self._event("response.output_item.added", output_index=0, item=s.item()),
            self._event("response.content_part.added", **self._where(), part=output_text("")),
        ]

    def delta(self, text: str) -> list[Frame]:
        self.state.text += text
        return [self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])]

    def end(self) -> list[Frame]:
        """After finish() or fail(): close the open part and item, then the terminal event."""
        s = self.state
        frames = []
        if s.status != "failed":
            frames += [
                self._event("response.output_text.done", **self._where(), text=s.text, logprobs=[]),
                self._event("response.content_part.done", **self._where(), part=output_text(s.text)),
                self._event("response.output_item.done", output_index=0, item=s.item()),
            ]
        return frames + [self._event(TERMINAL_EVENTS[s.status], response=s.object())]
