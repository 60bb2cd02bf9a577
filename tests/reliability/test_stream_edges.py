"""Stream edges through real Envoy (issue 28, item 8). Every SSE response says
`Cache-Control: no-cache` (and `X-Accel-Buffering: no`); every silence is filled with keep-alives
in the surface's own form, after the first token too (a slow step; a forced tool call the parser
holds until it is complete); a stream that fails mid-way still ends with its surface's terminal
frames and the usage so far, and the official SDKs still parse it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import anthropic
import httpx
import openai
import pytest

from tests.reliability.conftest import NULL_STEP

pytestmark = pytest.mark.reliability

LONG = 2000  # tokens: no stream ends before the fault
KEEPALIVE_S = 0.25
USER = [{"role": "user", "content": "Count to a thousand."}]


@dataclass
class SseRecord:
    """One SSE stream as the client saw it: its response headers and (seconds, block) per block."""

    marker: str  # a generated-text block contains it
    headers: dict[str, str] = field(default_factory=dict)
    blocks: list[tuple[float, str]] = field(default_factory=list)
    first_content: asyncio.Event = field(default_factory=asyncio.Event)

    def keepalives_after_first_content(self) -> int:
        first = next(i for i, (_, b) in enumerate(self.blocks) if self.marker in b)
        return sum(is_keepalive(b) for _, b in self.blocks[first:])

    def events(self) -> list[tuple[str | None, dict | str]]:
        out = []
        for _, block in self.blocks:
            if block.startswith(":"):
                continue
            name = data = None
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
            out.append((name, data if data == "[DONE]" else json.loads(data)))
        return out


def is_keepalive(block: str) -> bool:
    return block == ": keep-alive" or block.startswith("event: ping\n")


async def read_sse(client: httpx.AsyncClient, path: str, body: dict, record: SseRecord) -> SseRecord:
    t0 = time.monotonic()
    async with client.stream("POST", path, json=body) as reply:
        assert reply.status_code == 200, (path, await reply.aread())
        record.headers = dict(reply.headers)
        lines: list[str] = []
        async for line in reply.aiter_lines():
            if line:
                lines.append(line)
                continue
            if lines:
                block = "\n".join(lines)
                record.blocks.append((time.monotonic() - t0, block))
                if record.marker in block:
                    record.first_content.set()
                lines = []
    return record


def assert_sse_headers(record: SseRecord, where: str) -> None:
    h = record.headers
    assert h["content-type"].startswith("text/event-stream"), (where, h)
    assert h.get("cache-control") == "no-cache" and h.get("x-accel-buffering") == "no", (where, h)


STREAMS = {  # path, body, what a block with generated text contains
    "chat": ("/v1/chat/completions", {"model": "default", "stream": True, "max_tokens": LONG, "messages": USER},
             '"content":"'),
    "completions": ("/v1/completions", {"model": "default", "stream": True, "max_tokens": LONG,
                                        "prompt": "Count to a thousand."}, '"text":"'),
    "messages": ("/v1/messages", {"model": "default", "stream": True, "max_tokens": LONG, "messages": USER},
                 "event: content_block_delta"),
    "responses": ("/v1/responses", {"model": "default", "stream": True, "max_output_tokens": LONG, "store": False,
                                    "input": "Count to a thousand."}, "event: response.output_text.delta"),
}


def _anthropic_sdk(rig, first: threading.Event) -> tuple[str, Exception | None]:
    client = anthropic.Anthropic(base_url=rig.http, api_key="unused", max_retries=0)
    text = ""
    try:
        with client.messages.stream(model="default", max_tokens=LONG, messages=USER) as stream:
            for piece in stream.text_stream:
                text += piece
                first.set()
    except anthropic.APIStatusError as err:
        return text, err
    return text, None


def _responses_sdk(rig, first: threading.Event) -> list:
    client = openai.OpenAI(base_url=rig.http + "/v1", api_key="unused", max_retries=0)
    events = []
    for event in client.responses.create(model="default", input="Count to a thousand.", stream=True,
                                         max_output_tokens=LONG, store=False):
        events.append(event)
        if event.type == "response.output_text.delta":
            first.set()
    return events


def test_stream_edges_slow_step_keepalives_and_terminal_frames_after_a_failure(make_rig):
    """All streams run in one batch; once each has shown text, the fault is armed: the 3rd step
    after it stalls 2 s (keep-alives after the first token), the 10th raises, which fails every
    request in flight mid-stream."""
    rig = make_rig(faults="stall_step_at=3:2,forward_raise_at_step=10", generation_args=NULL_STEP,
                   preprocess_args=("--keepalive-s", str(KEEPALIVE_S)))

    async def scenario():
        firsts = [threading.Event(), threading.Event()]
        sdks = [asyncio.create_task(asyncio.to_thread(_anthropic_sdk, rig, firsts[0])),
                asyncio.create_task(asyncio.to_thread(_responses_sdk, rig, firsts[1]))]
        async with httpx.AsyncClient(base_url=rig.http, timeout=60) as client:
            records = {name: SseRecord(marker) for name, (_, _, marker) in STREAMS.items()}
            raws = [asyncio.create_task(read_sse(client, path, body, records[name]))
                    for name, (path, body, _) in STREAMS.items()]
            async with asyncio.timeout(30):
                await asyncio.gather(*(r.first_content.wait() for r in records.values()))
                for first in firsts:
                    assert await asyncio.to_thread(first.wait, 30)
            rig.arm()
            await asyncio.gather(*raws)
            return records, await asyncio.gather(*sdks)

    records, (anthropic_result, responses_events) = rig.run(scenario(), timeout_s=120)
    for name, record in records.items():
        assert_sse_headers(record, name)
        # The stalled step: ~2 s without a token, every KEEPALIVE_S a keep-alive.
        assert record.keepalives_after_first_content() >= 4, (name, record.blocks[-12:])
    for name in ("chat", "completions"):
        events = records[name].events()
        assert events[-1] == (None, "[DONE]") and "error" in events[-2][1], (name, events[-3:])
        assert events[-2][1]["error"]["type"] == "service_unavailable_error", events[-2]
    messages = records["messages"].events()
    names = [e for e, _ in messages if e != "ping"]
    assert names[-4:] == ["error", "content_block_stop", "message_delta", "message_stop"], names[-6:]
    delta = messages[-2][1]
    assert delta["delta"]["stop_reason"] is None and delta["usage"]["output_tokens"] > 0, delta
    assert messages[0][1]["message"]["usage"]["input_tokens"] > 0
    responses = records["responses"].events()
    assert responses[-1][0] == "response.failed", responses[-2:]
    usage = responses[-1][1]["response"]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    # The SDKs: anthropic's stream helper streamed text, then raised at the error event;
    # openai's typed events end with response.failed and its usage.
    text, err = anthropic_result
    assert text and isinstance(err, anthropic.APIStatusError), anthropic_result
    assert err.body["error"]["type"] == "overloaded_error", err.body
    assert responses_events[-1].type == "response.failed", [e.type for e in responses_events[-3:]]
    assert responses_events[-1].response.usage.output_tokens > 0


SCHEMA = {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "integer"},
                                                      "minItems": 24, "maxItems": 24}}, "required": ["values"]}
TOOL_STREAMS = {  # one forced call of a tool whose arguments take ~80 tokens, all held by the parser
    "chat": ("/v1/chat/completions", {
        "model": "default", "stream": True, "max_tokens": 300, "temperature": 0, "messages": USER,
        "parallel_tool_calls": False,
        "tools": [{"type": "function", "function": {"name": "record", "parameters": SCHEMA}}],
        "tool_choice": {"type": "function", "function": {"name": "record"}}}, '"tool_calls"'),
    "messages": ("/v1/messages", {
        "model": "default", "stream": True, "max_tokens": 300, "temperature": 0, "messages": USER,
        "tools": [{"name": "record", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "record", "disable_parallel_tool_use": True}}, '"tool_use"'),
    "responses": ("/v1/responses", {
        "model": "default", "stream": True, "max_output_tokens": 300, "temperature": 0, "store": False,
        "input": "Count.",
        "parallel_tool_calls": False, "tools": [{"type": "function", "name": "record", "parameters": SCHEMA}],
        "tool_choice": {"type": "function", "name": "record"}}, '"function_call"'),
}
TOOL_KEEPALIVE_S = 0.05


@pytest.mark.slow
def test_stream_edges_a_held_tool_call_is_kept_alive(make_rig):
    """The real model writes a forced call; no byte of it can go out until it is complete, so only
    keep-alives (every TOOL_KEEPALIVE_S) fill the time the call takes. (That the surface's pacer,
    not an engine silence, sends them is tests/unit/surfaces/test_stream_edges.py's to show.)"""
    rig = make_rig(null_engine=False, preprocess_args=("--keepalive-s", str(TOOL_KEEPALIVE_S)))

    async def scenario():
        async with httpx.AsyncClient(base_url=rig.http, timeout=240) as client:
            records = {name: SseRecord(marker) for name, (_, _, marker) in TOOL_STREAMS.items()}
            await asyncio.gather(*(read_sse(client, path, body, records[name])
                                   for name, (path, body, _) in TOOL_STREAMS.items()))
            return records

    records = rig.run(scenario(), timeout_s=240)
    for name, record in records.items():
        assert_sse_headers(record, name)
        times = [t for t, _ in record.blocks]
        call_at = next((t for t, b in record.blocks if record.marker in b), None)  # the call, all at once
        assert call_at is not None, (name, record.blocks[-3:])
        before = [b for t, b in record.blocks if t < call_at]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert sum(map(is_keepalive, before)) >= 2, (name, before[-3:])
        assert max(gaps) < 20 * TOOL_KEEPALIVE_S, (name, max(gaps))  # before: silent the whole call
    messages = records["messages"].events()  # what the stream held is still one well-formed call
    call = next(d for e, d in messages if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert len(json.loads(call["delta"]["partial_json"])["values"]) == 24
    assert messages[-2][1]["delta"]["stop_reason"] == "tool_use"
    rig.check_recovered(timeout_s=30)
