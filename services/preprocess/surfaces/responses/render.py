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

Every response ends with one of those terminal events, carrying the usage: a failed one
`response.failed` with `error` and the usage so far (the prompt, and the tokens generated before
it failed). Whenever the stream would otherwise stay silent (queued, prefilling, a slow step, a
tool call held until complete) it carries `: keep-alive` SSE comments (ignored by clients).

With tools, the text is parsed for calls (services/preprocess/tools.py): the message item opens at
the first text, and each call is a `function_call` item of its own (output_item.added with empty
arguments, function_call_arguments.delta, function_call_arguments.done, output_item.done).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import MstarError
from services.common.finish import FinishReason
from services.preprocess.request import Chunk, Complete, KeepAlive
from services.preprocess.surfaces.http import SSE_COMMENT_KEEPALIVE, Frame, KeepAlivePacer, sse
from services.preprocess.tools import CallStream, ToolCall

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
    prompt_tokens: int = 0
    tools: list[dict] = field(default_factory=list)  # echoed as given
    tool_choice: str | dict = "none"
    parallel_tool_calls: bool = False
    text_format: dict = field(default_factory=lambda: {"type": "text"})
    parser: CallStream | None = None  # with tools
    status: str = "in_progress"
    text: str = ""  # what the model wrote (calls included): the stored conversation's turn
    content: str = ""  # the message item's text (calls taken out)
    calls: list[ToolCall] = field(default_factory=list)
    message_open: bool = False  # whether the message item was added (streamed)
    message_position: int = 0  # calls before the message item in `output` (streamed: as it opened)
    unsent: str = ""  # text held as a possible call start until the end, not streamed yet
    output_tokens: int = 0  # generated so far
    usage: dict | None = None
    error: dict | None = None
    incomplete_reason: str | None = None
    sequence: int = field(default=0)

    def add_text(self, text: str) -> tuple[str, list[ToolCall]]:
        """Model output in; the message text and the calls it completed out."""
        self.text += text
        shown, calls = (text, []) if self.parser is None else self.parser.feed(text)
        self.content += shown
        self.calls += calls
        return shown, calls

    def finish(self, done: Complete) -> None:
        if self.parser is not None:
            self.unsent = self.parser.finish()
            self.content += self.unsent
        self.status = STATUS[done.finish_reason]
        if done.finish_reason is FinishReason.LENGTH:
            self.incomplete_reason = "max_output_tokens"
        self.usage = usage(done.prompt_tokens, done.cached_prompt_tokens, done.completion_tokens)

    def fail(self, err: MstarError) -> None:
        """Failed after admission: the usage so far (the engine reports its cache hit only at the end)."""
        self.status = "failed"
        self.error = {"code": err.reason.lower() or "server_error", "message": err.message}
        self.usage = usage(self.prompt_tokens, 0, self.output_tokens)

    def item(self) -> dict:
        done = self.status != "in_progress"
        return {
            "id": self.item_id,
            "type": "message",
            "status": ("completed" if self.status == "completed" else "incomplete") if done else "in_progress",
            "role": "assistant",
            "content": [output_text(self.content)] if done else [],
        }

    def has_message(self) -> bool:
        return self.message_open or bool(self.content) or not self.calls

    def output(self) -> list[dict]:
        if self.status in ("in_progress", "failed"):
            return []
        items = [function_call_item(c) for c in self.calls]
        if self.has_message():
            items.insert(min(self.message_position, len(items)), self.item())
        return items

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
            "output": self.output(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": self.store,
            "temperature": self.temperature,
            "text": {"format": self.text_format},
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": self.usage,
            "user": None,
            "metadata": self.metadata,
        }


def function_call_item(call: ToolCall, arguments: str | None = None, status: str = "completed") -> dict:
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call.id, "name": call.name, "arguments": call.arguments if arguments is None else arguments}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


class ResponseStream:
    """A ResponseState's life as SSE frames, each numbered."""

    def __init__(self, state: ResponseState, keepalive_s: float) -> None:
        self.state = state
        self.keepalives = KeepAlivePacer(keepalive_s, SSE_COMMENT_KEEPALIVE)
        self.items = 0  # output items added so far
        self.message_index = 0

    def on_event(self, event) -> list[Frame]:
        """An event before the terminal one: its frames, or a keep-alive to fill a silence."""
        frames = []
        if isinstance(event, Chunk):
            self.state.output_tokens += len(event.token_ids)
            if event.text:
                frames = self.delta(event.text)
        return self.keepalives.pace(frames, isinstance(event, KeepAlive))

    def _event(self, kind: str, **fields) -> Frame:
        obj = {"type": kind, "sequence_number": self.state.sequence, **fields}
        self.state.sequence += 1
        return sse(obj, kind)

    def _where(self) -> dict:
        return {"item_id": self.state.item_id, "output_index": self.message_index, "content_index": 0}

    def start(self) -> list[Frame]:
        s = self.state
        frames = [
            self._event("response.created", response=s.object()),
            self._event("response.in_progress", response=s.object()),
        ]
        return frames if s.parser is not None else frames + self._open_message()

    def _open_message(self) -> list[Frame]:
        s = self.state
        s.message_open = True
        s.message_position = len(s.calls)
        self.message_index, self.items = self.items, self.items + 1
        return [
            self._event("response.output_item.added", output_index=self.message_index, item=s.item()),
            self._event("response.content_part.added", **self._where(), part=output_text("")),
        ]

    def delta(self, text: str) -> list[Frame]:
        shown, calls = self.state.add_text(text)
        frames = []
        if shown:
            if not self.state.message_open:
                frames += self._open_message()
            frames.append(self._event("response.output_text.delta", **self._where(), delta=shown, logprobs=[]))
        for call in calls:
            frames += self._call(call)
        return frames

    def _call(self, call: ToolCall) -> list[Frame]:
        index, self.items = self.items, self.items + 1
        item_id = function_call_item(call)["id"]
        return [
            self._event("response.output_item.added", output_index=index,
                        item=function_call_item(call, arguments="", status="in_progress")),
            self._event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                        delta=call.arguments),
            self._event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                        arguments=call.arguments),
            self._event("response.output_item.done", output_index=index, item=function_call_item(call)),
        ]

    def end(self) -> list[Frame]:
        """After finish() or fail(): close the open part and item, then the terminal event."""
        s = self.state
        frames = []
        if s.status != "failed":
            if s.has_message() and not s.message_open:
                frames += self._open_message()
            if s.unsent and s.message_open:
                frames.append(self._event("response.output_text.delta", **self._where(), delta=s.unsent, logprobs=[]))
            if s.message_open:
                frames += [
                    self._event("response.output_text.done", **self._where(), text=s.content, logprobs=[]),
                    self._event("response.content_part.done", **self._where(), part=output_text(s.content)),
                    self._event("response.output_item.done", output_index=self.message_index, item=s.item()),
                ]
        return frames + [self._event(TERMINAL_EVENTS[s.status], response=s.object())]
