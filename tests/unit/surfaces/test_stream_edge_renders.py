"""Stream edges on every SSE surface (issue 28, item 8): the response headers, keep-alives through
every silence (a tool call the parser holds back included), the terminal frames after a failure
with the usage so far, and Anthropic's usage agreeing between message_start and message_delta. The
streams come from the endpoints on the in-process domain (echo engine) and are parsed with the
official `anthropic` and `openai` SDKs over a mock transport where the SDKs matter."""

from __future__ import annotations

import asyncio
import time

import anthropic
import httpx
import httpx2  # the anthropic SDK's own HTTP client package
import openai
import pytest
from surface_harness import EchoBackend, http, make_runner, sse_events

from services.preprocess import client
from services.preprocess.request import Accepted, Chunk, KeepAlive
from services.preprocess.surfaces.anthropic.endpoints import create_message
from services.preprocess.surfaces.http import SSE, SSE_COMMENT_KEEPALIVE, SSE_HEADERS, KeepAlivePacer
from services.preprocess.surfaces.openai import endpoints as openai_endpoints
from services.preprocess.surfaces.responses.endpoints import ResponsesApi
from services.preprocess.surfaces.responses.store import ResponseStore

TOOLS_OPENAI = [{"type": "function", "function": {"name": "record", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]
TOOLS_ANTHROPIC = [{"name": "record", "input_schema": TOOLS_OPENAI[0]["function"]["parameters"]}]
TOOLS_RESPONSES = [{"type": "function", "name": "record", "parameters": TOOLS_OPENAI[0]["function"]["parameters"]}]
USER = "Write it down. " * 20


@pytest.fixture
def api(tmp_path):
    store = asyncio.run(ResponseStore(tmp_path / "responses.sqlite3").open())
    yield ResponsesApi(store)
    asyncio.run(store.close())


def timed(endpoint, body: dict, runner) -> list[tuple[float, object]]:
    """(seconds since the call began, frame) for every frame the endpoint yields."""

    async def go():
        scope = runner.scope()
        t0 = time.monotonic()
        try:
            return [(time.monotonic() - t0, f) async for f in endpoint(http(body), scope)]
        finally:
            scope.close()

    return asyncio.run(go())


def raw(frames) -> bytes:
    return b"".join(f.data for _, f in frames)


def is_keepalive(frame) -> bool:
    return frame.data in (SSE_COMMENT_KEEPALIVE.data, b'event: ping\ndata: {"type":"ping"}\n\n')


# ---- the pacer


def test_pacer_fills_a_silence_and_never_interrupts_output():
    now = [0.0]
    pacer = KeepAlivePacer(2.0, SSE_COMMENT_KEEPALIVE, clock=lambda: now[0])
    output = [SSE_COMMENT_KEEPALIVE.__class__(b"data: x\n\n", SSE)]
    now[0] = 1.9
    assert pacer.pace([]) == []  # silent for less than the interval
    now[0] = 2.0
    assert pacer.pace([]) == [SSE_COMMENT_KEEPALIVE]
    now[0] = 3.9
    assert pacer.pace([]) == []  # the keep-alive reset the clock
    assert pacer.pace(output) == output
    now[0] = 5.0
    assert pacer.pace([]) == []  # output 1.1 s ago
    assert pacer.pace([], keepalive=True) == [SSE_COMMENT_KEEPALIVE]  # the run's KeepAlive: always
    now[0] = 7.0
    assert pacer.pace([]) == [SSE_COMMENT_KEEPALIVE]


# ---- headers


def _streams(runner, api):
    yield "chat", timed(openai_endpoints.chat_completions,
                        {"model": "default", "stream": True, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "Hi"}]}, runner)
    yield "completions", timed(openai_endpoints.completions,
                               {"model": "default", "stream": True, "max_tokens": 4, "prompt": "Hi"}, runner)
    yield "messages", timed(create_message, {"model": "default", "stream": True, "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "Hi"}]}, runner)
    yield "responses", timed(api.create, {"model": "default", "stream": True, "max_output_tokens": 4,
                                          "input": "Hi", "store": False}, runner)


def test_every_sse_stream_sends_no_cache_and_no_proxy_buffering(runner, api):
    for name, frames in _streams(runner, api):
        first = frames[0][1]
        assert first.content_type == SSE, name
        headers = dict(first.headers)
        assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no", (name, headers)
        assert all(f.headers == SSE_HEADERS for _, f in frames), name  # whichever frame comes first
    whole = timed(create_message, {"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "Hi"}]}, runner)
    assert "cache-control" not in dict(whole[0][1].headers)  # a JSON body is an ordinary response


# ---- keep-alives while the tool-call parser holds text back


@pytest.mark.parametrize("surface", ["chat", "messages", "responses"])
def test_a_held_tool_call_is_kept_alive_by_the_surface(model, api, surface):
    """The echo engine writes the prompt back, whose tool definitions hold `<tool_call>` followed by
    no JSON: from there the parser holds every token (about 250 at 10 ms each) until the end. The
    engine is never silent, so only the surface's pacer can keep the stream alive."""
    runner = make_runner(model, EchoBackend(step_s=0.01))
    runner.deps.keepalive_s = 0.1
    if surface == "chat":
        frames = timed(openai_endpoints.chat_completions,
                       {"model": "default", "stream": True, "max_tokens": 400, "tools": TOOLS_OPENAI,
                        "messages": [{"role": "user", "content": USER}]}, runner)
    elif surface == "messages":
        frames = timed(create_message, {"model": "default", "stream": True, "max_tokens": 400,
                                        "tools": TOOLS_ANTHROPIC,
                                        "messages": [{"role": "user", "content": USER}]}, runner)
    else:
        frames = timed(api.create, {"model": "default", "stream": True, "max_output_tokens": 400, "store": False,
                                    "tools": TOOLS_RESPONSES, "input": USER}, runner)
    keepalives = [t for t, f in frames if is_keepalive(f)]
    gaps = [b[0] - a[0] for a, b in zip(frames, frames[1:], strict=False)]
    total_s = frames[-1][0]
    assert total_s > 1.0, f"the echo ended too soon to hold anything: {total_s:.2f} s"
    assert len(keepalives) >= total_s / 0.1 / 3, (len(keepalives), total_s)
    assert max(gaps) < 1.0, max(gaps)  # before the pacer: the whole held stretch (> 1 s) in one gap


def test_flowing_output_needs_no_keepalive():
    now = [0.0]
    pacer = KeepAlivePacer(0.1, SSE_COMMENT_KEEPALIVE, clock=lambda: now[0])
    for step in range(100):
        now[0] = step * 0.01
        assert pacer.pace([SSE_COMMENT_KEEPALIVE.__class__(b"data: x\n\n", SSE)]) != [SSE_COMMENT_KEEPALIVE]


# ---- Anthropic: usage, and the end after an error, through the SDK


def _anthropic_client(body: bytes) -> anthropic.Anthropic:
    def reply(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": SSE}, content=body)

    return anthropic.Anthropic(api_key="x", base_url="http://mstar.test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(reply)))


def test_anthropic_start_and_delta_usage_agree_and_the_sdk_keeps_them(runner):
    frames = timed(create_message, {"model": "default", "stream": True, "max_tokens": 6,
                                    "messages": [{"role": "user", "content": "Hi"}]}, runner)
    events = dict((e, d) for e, d in sse_events([f for _, f in frames]) if e in ("message_start", "message_delta"))
    start, delta = events["message_start"]["message"]["usage"], events["message_delta"]["usage"]
    assert start["output_tokens"] == 0 and start["cache_read_input_tokens"] is None
    assert set(delta) == {"output_tokens"} and delta["output_tokens"] == 6  # nothing to contradict start
    with _anthropic_client(raw(frames)).messages.stream(
            model="default", max_tokens=6, messages=[{"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens == start["input_tokens"] > 0
    assert final.usage.output_tokens == 6 and final.usage.cache_read_input_tokens is None


def test_anthropic_error_mid_stream_ends_with_message_delta_and_stop(model):
    runner = make_runner(model, EchoBackend(fail_after=3))
    frames = timed(create_message, {"model": "default", "stream": True, "max_tokens": 16,
                                    "messages": [{"role": "user", "content": "Hi"}]}, runner)
    events = sse_events([f for _, f in frames])
    names = [e for e, _ in events if e != "ping"]
    assert names[-4:] == ["error", "content_block_stop", "message_delta", "message_stop"], names
    assert names.count("content_block_delta") >= 1  # it failed mid-way
    delta = next(d for e, d in events if e == "message_delta")
    assert delta == {"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
                     "usage": {"output_tokens": 3}}
    with pytest.raises(anthropic.APIStatusError) as info:  # the SDK raises at the error event
        with _anthropic_client(raw(frames)).messages.stream(
                model="default", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]) as stream:
            for _ in stream:
                pass
    assert info.value.body["error"]["type"] == "overloaded_error"


# ---- Responses: response.failed with the usage so far, through the SDK


def test_responses_failure_mid_stream_is_response_failed_with_usage(model, api):
    runner = make_runner(model, EchoBackend(fail_after=3))
    frames = timed(api.create, {"model": "default", "stream": True, "max_output_tokens": 16, "store": True,
                                "input": "Hi"}, runner)
    events = sse_events([f for _, f in frames])
    assert events[-1][0] == "response.failed"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "backend_unavailable"
    usage = failed["usage"]
    assert usage["output_tokens"] == 3 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + 3

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": SSE}, content=raw(frames))

    sdk = openai.OpenAI(api_key="x", base_url="http://mstar.test/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(reply)))
    parsed = list(sdk.responses.create(model="default", input="Hi", stream=True))
    assert parsed[-1].type == "response.failed" and parsed[-1].response.usage.output_tokens == 3
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    stored = asyncio.run(api.store.get(failed["id"], client.ANONYMOUS))
    assert stored is not None and stored.response["usage"] == usage


def test_keepalive_events_become_each_surfaces_own_form():
    from services.preprocess.surfaces.anthropic import render as anthropic_render
    from services.preprocess.surfaces.openai.choices import Choices

    out = anthropic_render.MessageStream("m", 30.0)
    out.on_event(Accepted("r", "", 3, 8))
    assert [e for e, _ in sse_events(out.on_event(KeepAlive("r")))] == ["ping"]
    out.on_event(Chunk("r", 0, "Hi", (1,)))
    assert [e for e, _ in sse_events(out.on_event(KeepAlive("r")))] == ["ping"]  # after the first token too
    choices = Choices(chat=True, n=1, stream=True, include_usage=False, logprobs=False, model="m",
                      token_text=str, token_bytes=bytes, keepalive_s=30.0)
    choices.on_event(0, Accepted("r", "", 3, 8))
    choices.on_event(0, Chunk("r", 0, "Hi", (1,)))
    assert choices.on_event(0, KeepAlive("r")) == [SSE_COMMENT_KEEPALIVE]
