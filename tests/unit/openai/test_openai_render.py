"""Rendering: SSE chunks, usage, [DONE], keep-alives, errors (before and after the first byte)."""

import asyncio
import json
import re
from pathlib import Path

import pytest
from google.api import httpbody_pb2
from mstar.v1 import inference_service_pb2 as ipb
from mstar.v1 import messages_pb2 as mpb

from services.preprocess import openai
from services.preprocess.openai import render

ROOT = Path(__file__).resolve().parents[3]


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self):
        self.status = None
        self.initial_metadata = None

    async def send_initial_metadata(self, metadata):
        self.initial_metadata = dict(metadata)

    async def abort_with_status(self, status):
        self.status = status
        raise Aborted(status.details)


def events(script):
    """A fake `run`: yields the scripted events; records inputs and whether it was closed."""
    seen = {"inputs": [], "closed": 0}

    async def run(inp, context):
        seen["inputs"].append(inp)
        try:
            for ev in script(inp):
                await asyncio.sleep(0)
                yield ev
        finally:
            seen["closed"] += 1
    return run, seen


def normal(inp):
    rid = f"r{inp.model_kwargs.sampling.seed}"
    yield ipb.GenerateStreamResponse(accepted=ipb.RequestAccepted(request_id=rid, prompt_tokens=4))
    yield ipb.GenerateStreamResponse(keep_alive=ipb.KeepAlive(request_id=rid))
    lp = mpb.TokenLogprobs(logprob=-0.5, top_token_ids=[7, 8], top_logprobs=[-0.5, -1.0])
    yield ipb.GenerateStreamResponse(chunk=mpb.ResultChunk(request_id=rid, text="Hel", token_ids=[7], logprobs=[lp]))
    yield ipb.GenerateStreamResponse(chunk=mpb.ResultChunk(request_id=rid, text="lo", token_ids=[8], logprobs=[lp]))
    yield ipb.GenerateStreamResponse(complete=mpb.RequestComplete(
        request_id=rid, finish_reason=mpb.FINISH_REASON_STOP,
        usage=mpb.Usage(prompt_tokens=4, cached_prompt_tokens=1, completion_tokens=2, total_tokens=6)))


def collect(fn, body: dict, run, **options):
    ctx = FakeContext()
    req = httpbody_pb2.HttpBody(content_type="application/json", data=json.dumps(body).encode())

    async def go():
        return [b async for b in fn(req, ctx, run, model_name="served", **options)]
    try:
        return asyncio.run(go()), ctx
    except Aborted:
        return None, ctx


def sse_frames(bodies):
    data = b"".join(b.data for b in bodies).decode()
    assert data.endswith("\n\n")
    return data[:-2].split("\n\n")


def test_chat_stream_chunks_usage_done_and_keepalive():
    run, seen = events(normal)
    bodies, _ = collect(openai.chat_completions, {"messages": [{"role": "user", "content": "x"}], "stream": True,
                                                  "stream_options": {"include_usage": True}, "seed": 1}, run)
    assert all(b.content_type == "text/event-stream" for b in bodies)
    frames = sse_frames(bodies)
    assert frames[0] == ": keep-alive" and frames[-1] == "data: [DONE]"
    chunks = [json.loads(f[6:]) for f in frames[1:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert chunks[1]["choices"][0]["delta"] == {"content": "lo"}
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[0]["id"] == "chatcmpl-r1"
    usage = chunks[-1]["usage"]
    timings = usage.pop("mstar_timings")
    assert chunks[-1]["choices"] == [] and usage == {
        "prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 1}}
    assert len(timings) == 1 and set(timings[0]) >= {"queue_ms", "time_to_first_token_ms", "e2e_ms"}
    assert chunks[0]["model"] == "served" and chunks[0]["object"] == "chat.completion.chunk"
    assert seen["closed"] == 1


def test_keepalive_can_be_turned_off_and_no_usage_by_default():
    run, _ = events(normal)
    bodies, _ = collect(openai.chat_completions, {"messages": [{"role": "user", "content": "x"}], "stream": True},
                        run, keep_alive=False)
    frames = sse_frames(bodies)
    assert frames[0].startswith("data: {") and all("usage" not in f for f in frames)


def test_chat_non_stream_with_logprobs_and_n():
    run, seen = events(normal)
    bodies, _ = collect(openai.chat_completions, {"messages": [{"role": "user", "content": "x"}], "n": 2,
                                                  "seed": 10, "logprobs": True, "top_logprobs": 2}, run,
                        token_text=lambda t: f"<{t}>")
    assert len(bodies) == 1 and bodies[0].content_type == "application/json"
    resp = json.loads(bodies[0].data)
    assert [c["message"]["content"] for c in resp["choices"]] == ["Hello", "Hello"]
    assert [c["index"] for c in resp["choices"]] == [0, 1]
    assert [i.model_kwargs.sampling.seed for i in seen["inputs"]] == [10, 11]
    assert resp["usage"]["completion_tokens"] == 4 and resp["usage"]["prompt_tokens"] == 4
    content = resp["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "<7>" and content[0]["top_logprobs"][1] == {
        "token": "<8>", "logprob": -1.0, "bytes": list(b"<8>")}
    assert seen["closed"] == 2


def test_completion_stream_and_logprobs_offsets():
    run, _ = events(normal)
    bodies, _ = collect(openai.completions, {"prompt": "x", "stream": True, "logprobs": 1}, run,
                        token_text=lambda t: "ab")
    chunks = [json.loads(f[6:]) for f in sse_frames(bodies)[1:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["Hel", "lo", ""]
    assert chunks[0]["object"] == "text_completion" and chunks[0]["id"].startswith("cmpl-")
    assert chunks[1]["choices"][0]["logprobs"]["text_offset"] == [3]


def test_errors_before_first_byte_abort_with_status():
    run, seen = events(normal)
    bodies, ctx = collect(openai.chat_completions, {"messages": [{"role": "user", "content": "x"}], "n": 99}, run)
    assert bodies is None and ctx.status.code.name == "INVALID_ARGUMENT" and "n:" in ctx.status.details
    assert seen["inputs"] == []

    def fails_early(inp):
        yield ipb.GenerateStreamResponse(accepted=ipb.RequestAccepted(request_id="r"))
        yield ipb.GenerateStreamResponse(failed=mpb.RequestFailed(request_id="r", message="kv full", code=8,
                                                                  http_status=429, reason="KV_FULL"))
    run, _ = events(fails_early)
    bodies, ctx = collect(openai.completions, {"prompt": "x", "stream": True}, run, keep_alive=False)
    assert bodies is None and ctx.status.code.name == "RESOURCE_EXHAUSTED"


def test_failure_after_first_byte_is_in_band():
    def fails_late(inp):
        yield ipb.GenerateStreamResponse(accepted=ipb.RequestAccepted(request_id="r"))
        yield ipb.GenerateStreamResponse(chunk=mpb.ResultChunk(request_id="r", text="par"))
        yield ipb.GenerateStreamResponse(failed=mpb.RequestFailed(request_id="r", message="backend lost", code=14,
                                                                  http_status=503, reason="BACKEND_UNAVAILABLE"))
    run, _ = events(fails_late)
    bodies, _ = collect(openai.chat_completions, {"messages": [{"role": "user", "content": "x"}], "stream": True},
                        run)
    frames = sse_frames(bodies)
    assert json.loads(frames[-2][6:]) == {"error": {"message": "backend lost", "type": "service_unavailable_error",
                                                    "code": "backend_unavailable", "param": None}}
    assert frames[-1] == "data: [DONE]"


def test_client_disconnect_closes_every_choice():
    def endless(inp):
        yield ipb.GenerateStreamResponse(accepted=ipb.RequestAccepted(request_id="r"))
        while True:
            yield ipb.GenerateStreamResponse(chunk=mpb.ResultChunk(request_id="r", text="x"))
    run, seen = events(endless)
    body = httpbody_pb2.HttpBody(data=json.dumps({"prompt": "x", "stream": True, "n": 3}).encode())

    async def go():
        stream = openai.completions(body, FakeContext(), run)
        for _ in range(5):
            await stream.__anext__()
        await stream.aclose()  # what grpc does when the client goes away
    asyncio.run(go())
    assert seen["closed"] == 3


def test_lua_error_types_match_python():
    lua = (ROOT / "deploy/envoy/openai_errors.lua").read_text()
    table = {int(k): v for k, v in re.findall(r'\[(\d+)\] = "([a-z_]+)"', lua)}
    assert table == render.ERROR_TYPES


@pytest.mark.parametrize(("value", "name"), [(1, "stop"), (2, "length"), (3, "stop"), (4, "stop"), (0, "stop")])
def test_finish_reasons_are_openai_values(value, name):
    # FINISH_REASON_CANCELLED used to render as "abort", which OpenAI clients do not know.
    assert render.finish_reason(value) == name and name in render.OPENAI_FINISH_REASONS


def test_logprob_bytes_of_a_partial_utf8_token_are_its_own_bytes():
    # "€" is E2 82 AC; a byte-fallback token holding only E2 82 shows as U+FFFD but its bytes are real.
    pieces = {5: b"\xe2\x82", 6: b"\xac", 7: b"ok"}
    entries = [render.TokenLogprob(5, -0.1, [(5, -0.1), (7, -2.0)]), render.TokenLogprob(6, -0.2, [])]
    out = render.chat_logprobs(entries, lambda t: pieces[t].decode("utf-8", "replace"), pieces.__getitem__)
    content = out["content"]
    assert content[0]["token"] == "\ufffd" and content[0]["bytes"] == [0xE2, 0x82]
    assert bytes(content[0]["bytes"] + content[1]["bytes"]).decode() == "€"
    assert content[0]["top_logprobs"][1]["bytes"] == list(b"ok")
