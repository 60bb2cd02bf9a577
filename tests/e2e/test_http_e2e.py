"""HTTP/JSON through Envoy against the real stack: native and OpenAI routes, stream and not,
and every error an HTTP client should see as JSON with the right status."""

from __future__ import annotations

import dataclasses
import json
import sys

import httpx
import pytest

from deploy.envoy.render import VARIANTS
from services.stack import readiness
from services.stack.envoy import start_envoy
from services.stack.ports import free_port
from services.stack.process import Child

pytestmark = pytest.mark.e2e

SAMPLING = {"max_tokens": 8, "temperature": 0}
CHAT = {"model": "default", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a color."}]}


def sse_data(text: str) -> list[str]:
    return [frame[6:] for frame in text.split("\n\n") if frame.startswith("data: ")]


def openai_error(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert not [h for h in reply.headers if h.startswith("grpc-")]
    return reply.json()["error"]


def test_native_generate_and_stream_agree(stack):
    body = {"text": "The capital of France is", "model_kwargs": {"sampling": SAMPLING}}
    whole = httpx.post(stack.http_url + "/v1/generate", json=body, timeout=60)
    assert whole.status_code == 200 and not [h for h in whole.headers if h.startswith("grpc-")]
    with httpx.stream("POST", stack.http_url + "/v1/generate_stream", json=body, timeout=60) as reply:
        assert reply.headers["content-type"] == "text/event-stream"
        events = [json.loads(d) for d in sse_data(reply.read().decode())]
    assert "accepted" in events[0] and "complete" in events[-1]
    streamed = "".join(e["chunk"]["text"] for e in events if "chunk" in e)
    assert streamed == whole.json()["text"] and streamed
    assert whole.json()["complete"]["usage"]["completion_tokens"] == 8


def test_models_report_how_the_backend_computes(stack):
    reply = httpx.get(stack.http_url + "/v1/models", timeout=30)
    assert reply.status_code == 200, reply.text
    model = reply.json()["data"][0]
    # The default model at its defaults: the GGUF's own Q4_1 / Q8_0 codes through the CPU kernels.
    assert model["numerics"]["device"] == "cpu" and model["numerics"]["kernels"] == "cpu", model
    assert "Q4_1 codes" in model["numerics"]["weights"] and model["numerics"]["activations"] == "float32"


def test_chat_stream_and_non_stream(stack):
    whole = httpx.post(stack.http_url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert whole.status_code == 200, whole.text
    resp = whole.json()
    assert resp["object"] == "chat.completion" and resp["choices"][0]["finish_reason"] in ("stop", "length")
    stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", stack.http_url + "/v1/chat/completions", json=stream, timeout=60) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
        data = sse_data(reply.read().decode())
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == resp["choices"][0]["message"]["content"]
    usage = chunks[-1]["usage"]  # cached_tokens may differ: the second call hits the prefix cache
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        resp["usage"]["prompt_tokens"], resp["usage"]["completion_tokens"])
    # The usage extension carries the generation service's timing breakdown.
    timings = resp["usage"]["mstar_timings"][0]
    assert timings["e2e_ms"] >= timings["time_to_first_token_ms"] > 0
    assert float(whole.headers["x-mstar-e2e-ms"]) > 0  # and as headers on the non-streamed reply


def test_errors_are_json_with_the_right_status(stack):
    url = stack.http_url
    err = openai_error(httpx.post(url + "/v1/chat/completions", content=b"{oops",
                                  headers={"content-type": "application/json"}), 400)
    assert err["code"] == "invalid_json" and err["param"] == "body"
    native = httpx.post(url + "/v1/generate", content=b"{oops", headers={"content-type": "application/json"})
    assert native.status_code == 400 and native.json()["code"] == 3
    missing = openai_error(httpx.get(url + "/v1/nope"), 404)  # an unknown /v1 path: OpenAI's shape
    assert missing["code"] == "unknown_route" and missing["message"] == "Invalid URL (GET /v1/nope)"
    long_prompt = "hello " * 9000  # > the 8192-token context
    err = openai_error(httpx.post(url + "/v1/completions", timeout=60,
                                  json={"model": "default", "prompt": long_prompt, "max_tokens": 1}), 400)
    assert err["type"] == "invalid_request_error" and err["param"]
    err = openai_error(httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": "8"}), 400)
    assert err["param"] == "max_tokens"


@pytest.fixture(scope="module")
def tight(stack, tmp_path_factory):
    """A second preprocess admitting one request at a time (same generation), behind its own Envoy."""
    tmp = tmp_path_factory.mktemp("tight")
    port = free_port()
    pre = Child("preprocess-tight", [sys.executable, "-m", "services.preprocess", "--generation",
                                     stack.generation_target, "--port", str(port), "--max-requests", "1"],
                tmp / "preprocess.log")
    settings = dataclasses.replace(VARIANTS["local"], http_port=free_port(), admin_port=free_port(),
                                   upstream_port=port)
    envoy = start_envoy(settings, tmp)
    base = f"http://127.0.0.1:{settings.http_port}"
    try:
        readiness.poll("tight stack", readiness.http_ok(base + "/health"), 120,
                       alive=lambda: pre.alive() and envoy.alive())
        yield base
    finally:
        envoy.stop(5)
        pre.stop(10)


def test_overload_is_429_with_retry_after(tight):
    # Long enough to still be running when the second request arrives; closing the stream aborts it.
    busy = {"model": "default", "prompt": "Count:", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", tight + "/v1/completions", json=busy, timeout=60) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # keep a reference: a collected iterator closes the response
        next(lines)  # admitted and running
        second = httpx.post(tight + "/v1/completions", json={**busy, "max_tokens": 4}, timeout=30)
        err = openai_error(second, 429)
        assert err["type"] == "rate_limit_error" and int(second.headers["retry-after"]) >= 1
        native = httpx.post(tight + "/v1/generate", json={"text": "x"}, timeout=30)
        assert native.status_code == 429 and native.json()["code"] == 8


def test_backend_down_is_503(tmp_path):
    settings = dataclasses.replace(VARIANTS["local"], http_port=free_port(), admin_port=free_port(),
                                   upstream_port=free_port())  # nothing listens there
    envoy = start_envoy(settings, tmp_path)
    base = f"http://127.0.0.1:{settings.http_port}"
    try:
        readiness.poll("envoy", readiness.http_ok(f"http://127.0.0.1:{settings.admin_port}/ready", "LIVE"), 30)
        err = openai_error(httpx.post(base + "/v1/chat/completions", json=CHAT, timeout=10), 503)
        assert err["type"] == "service_unavailable_error"
        assert httpx.get(base + "/health").status_code == 503
    finally:
        envoy.stop(5)
