"""The rendered Envoy config in front of a scripted upstream (fake_upstream.py, no model):
error shapes and statuses, SSE passthrough, grpc-* header hygiene, gRPC passthrough, limits.
Fast (~3 s): Envoy starts in well under a second; the fake answers instantly."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from envoy_harness import anthropic_error, in_front_of_fake, openai_error, start
from mstar.v1 import inference_service_pb2 as ipb
from mstar.v1 import inference_service_pb2_grpc as ipb_grpc

from deploy.envoy.render import VARIANTS
from services.stack import readiness
from services.stack.envoy import start_envoy
from services.stack.ports import free_port


@pytest.fixture(scope="module")
def envoy(tmp_path_factory):
    with in_front_of_fake(tmp_path_factory.mktemp("envoy")) as base:
        yield base


def chat(base, content, **extra):
    return httpx.post(base + "/v1/chat/completions", timeout=10,
                      json={"model": "m", "messages": [{"role": "user", "content": content}], **extra})


def test_openai_errors_are_reshaped_with_status(envoy):
    err = openai_error(chat(envoy, "too long"), 400)
    assert err == {"message": "text: prompt is 9000 tokens, context is 8192", "type": "invalid_request_error",
                   "code": "prompt_too_long", "param": "text"}
    reply = chat(envoy, "overload")
    assert openai_error(reply, 429)["type"] == "rate_limit_error" and reply.headers["retry-after"] == "1"
    assert openai_error(chat(envoy, "hi", max_token=3), 400)["param"] == "max_token"
    bad = httpx.post(envoy + "/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert openai_error(bad, 400)["code"] == "invalid_json"
    big = httpx.post(envoy + "/v1/completions", content=b"x" * (5 * 1024 * 1024),
                     headers={"content-type": "application/json"})
    assert openai_error(big, 413)["message"]


def message(base, content, **extra):
    return httpx.post(base + "/v1/messages", timeout=10, json={
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}], **extra})


def test_anthropic_errors_are_anthropic_shaped_with_status(envoy):
    assert anthropic_error(message(envoy, "too long"), 400) == {
        "type": "invalid_request_error", "message": "text: prompt is 9000 tokens, context is 8192"}
    reply = message(envoy, "overload")
    assert anthropic_error(reply, 429)["type"] == "rate_limit_error" and reply.headers["retry-after"] == "1"
    assert "max_tokens" in anthropic_error(httpx.post(envoy + "/v1/messages", json={"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}), 400)["message"]
    big = httpx.post(envoy + "/v1/messages", content=b"x" * (5 * 1024 * 1024),
                     headers={"content-type": "application/json"})
    assert anthropic_error(big, 413)["type"] == "request_too_large"
    form = httpx.post(envoy + "/v1/messages/count_tokens", content=b"a=b",
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert anthropic_error(form, 415)["type"] == "invalid_request_error"
    assert httpx.post(envoy + "/v1/messages/count_tokens", json={"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}).json() == {"input_tokens": 3}


def test_anthropic_stream_and_in_band_error(envoy):
    reply = message(envoy, "fail late", stream=True)
    assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
    events = [block.split("\n")[0] for block in reply.text.strip().split("\n\n")]
    assert events[:3] == ["event: message_start", "event: content_block_start", "event: ping"]
    # The error in band, then the terminal frames with the usage so far (issue 28).
    assert events[-4:] == ["event: error", "event: content_block_stop", "event: message_delta", "event: message_stop"]
    reply = message(envoy, "hi", stream=True)
    assert [b.split("\n")[0] for b in reply.text.strip().split("\n\n")][-1] == "event: message_stop"


def test_responses_models_and_utilities_routes(envoy):
    created = httpx.post(envoy + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=10)
    assert created.status_code == 200 and created.json()["output"][0]["content"][0]["text"] == "Hello world"
    rid = created.json()["id"]
    assert httpx.get(envoy + f"/v1/responses/{rid}").json()["id"] == rid
    assert httpx.post(envoy + f"/v1/responses/{rid}/cancel").json()["status"] == "incomplete"
    assert httpx.delete(envoy + f"/v1/responses/{rid}").json() == {"id": rid, "object": "response", "deleted": True}
    assert openai_error(httpx.get(envoy + f"/v1/responses/{rid}"), 404)["code"] == "response_not_found"
    assert openai_error(httpx.get(envoy + "/v1/responses/" + "x" * 300), 400)["param"] == "response_id"
    form = httpx.post(envoy + "/v1/responses", content=b"a=b", headers={"content-type": "text/plain"})
    assert openai_error(form, 415)["type"] == "invalid_request_error"
    models = httpx.get(envoy + "/v1/models").json()
    assert models["data"][0]["created"] == 1700000000 and models["object"] == "list"
    assert httpx.get(envoy + "/v1/models/fake").json()["id"] == "fake"
    assert openai_error(httpx.get(envoy + "/v1/models/gpt-4"), 404)["code"] == "model_not_found"
    assert httpx.get(envoy + "/version").json()["version"]
    assert httpx.post(envoy + "/tokenize", json={"prompt": "hi"}).json()["count"] == 3


def test_native_errors_keep_the_status_shape(envoy):
    reply = httpx.post(envoy + "/v1/generate", json={"text": "too long"})
    assert reply.status_code == 400 and not [h for h in reply.headers if h.startswith("grpc-")]
    body = reply.json()
    assert body["code"] == 3 and body["details"][0]["reason"] == "PROMPT_TOO_LONG"
    reply = httpx.post(envoy + "/v1/generate", content=b"{bad", headers={"content-type": "application/json"})
    assert reply.status_code == 400 and reply.json()["code"] == 3
    reply = httpx.get(envoy + "/no/such/route")
    assert reply.status_code == 404 and reply.json()["code"] == 5
    assert httpx.get(envoy + "/health").json() == {"status": "SERVING"}


def test_sse_streams_pass_through_with_keepalive_and_in_band_errors(envoy):
    with httpx.stream("POST", envoy + "/v1/completions", json={"prompt": "fail late", "stream": True}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
        frames = reply.read().decode().strip().split("\n\n")
    assert frames[0] == ": keep-alive" and frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2][6:])["error"]["type"] == "service_unavailable_error"
    reply = httpx.post(envoy + "/v1/generate_stream", json={"text": "hi"})
    events = [json.loads(line[6:]) for line in reply.text.split("\n\n") if line.startswith("data: ")]
    assert reply.headers["content-type"] == "text/event-stream" and "accepted" in events[0]
    assert "".join(e["chunk"]["text"] for e in events if "chunk" in e) == "Hello world"
    assert not [h for h in reply.headers if h.startswith("grpc-")]
    assert reply.headers["cache-control"] == "no-cache" and reply.headers["x-accel-buffering"] == "no"


def test_plain_grpc_passes_through_with_rich_errors(envoy):
    target = envoy.removeprefix("http://")
    with grpc.insecure_channel(target) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)
        assert stub.ListModels(ipb.ListModelsRequest(), timeout=5).data[0].id == "fake"
        with pytest.raises(grpc.RpcError) as info:
            list(stub.GenerateStream(ipb.GenerateStreamRequest(input={"text": "too long"}), timeout=5))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert any(k == "grpc-status-details-bin" for k, _ in info.value.trailing_metadata())
    listing = subprocess.run([str(Path(sys.executable).parent / "grpcurl"), "-plaintext", target, "list"],
                             capture_output=True, text=True, timeout=30)
    assert "mstar.v1.InferenceService" in listing.stdout and "grpc.health.v1.Health" in listing.stdout


def test_a_grpc_clients_deadline_reaches_the_server(envoy):
    # The server ends a call's requests at the client's deadline even if the client's cancel
    # never arrives (a missed cancel held a slot until max_tokens), so it must see that deadline:
    # with max_stream_duration on the plain gRPC route, Envoy rewrote grpc-timeout to 1800 s.
    with grpc.insecure_channel(envoy.removeprefix("http://")) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)
        deadline = lambda timeout: eval(stub.Generate(ipb.GenerateRequest(input={"text": "deadline?"}),  # noqa: E731
                                                      timeout=timeout).text)
        assert 3.0 < deadline(5.0) <= 5.5  # the wire format rounds up (100 s travels as 101S)
        assert 60.0 < deadline(100.0) <= 101.5
        assert deadline(None) is None


def test_dead_backend_is_an_immediate_json_503(tmp_path):
    child, base = start(tmp_path, free_port(), wait_healthy=False)  # nothing listens upstream
    try:
        reply = httpx.post(base + "/v1/chat/completions", json={"messages": []}, timeout=5)
        err = openai_error(reply, 503)
        assert err["type"] == "service_unavailable_error" and err["code"] == "no_healthy_upstream"
        assert reply.headers["retry-after"] == "1"  # retryable, and when
        native = httpx.post(base + "/v1/generate", json={"text": "x"}, timeout=5)
        assert native.status_code == 503 and native.json()["code"] == 14
        anthropic = httpx.post(base + "/v1/messages", json={}, timeout=5)
        assert anthropic_error(anthropic, 503)["type"] == "overloaded_error"
        health = httpx.get(base + "/health", timeout=5)
        assert health.status_code == 503 and health.json() == {"status": "NOT_SERVING"}
    finally:
        child.stop(5)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_routes_answer_wrong_method_and_content_type_in_openai_shape(envoy, path):
    for method in ("GET", "PUT", "DELETE"):
        reply = httpx.request(method, envoy + path, timeout=10)
        body = openai_error(reply, 405)
        assert reply.headers["allow"] == "POST" and body["code"] == "method_not_allowed", body
    reply = httpx.post(envoy + path, content=b'{"prompt": "x"}', headers={"content-type": "text/plain"}, timeout=10)
    body = openai_error(reply, 415)
    assert body["code"] == "unsupported_media_type" and body["type"] == "invalid_request_error"


def test_native_routes_answer_wrong_method_with_405_in_status_shape(envoy):
    reply = httpx.get(envoy + "/v1/generate", timeout=10)
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    body = reply.json()
    assert body["code"] == 12 and body["details"][0]["reason"] == "METHOD_NOT_ALLOWED"


# ---- request hygiene (deploy/envoy/request_hygiene.lua; issue 13, findings 4 and 12)


def test_an_invalid_grpc_timeout_is_a_400_for_that_request_only(envoy):
    # Forwarded as it was, it broke the upstream's header decoding: a 500, and other clients'
    # requests on the shared connection failed INTERNAL. Bad and good requests interleave here.
    import concurrent.futures

    def call(i):
        bad = i % 3 == 0
        headers = {"grpc-timeout": ["abc", "-1S", "1", "123456789S"][i % 4]} if bad else {}
        return bad, httpx.post(envoy + "/v1/generate", json={"text": "hi"}, headers=headers, timeout=20)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(60)))
    for bad, reply in results:
        if bad:
            assert reply.status_code == 400 and reply.json()["code"] == 3, reply.text
            assert "grpc-timeout" in reply.json()["message"]
        else:
            assert reply.status_code == 200, reply.text
    ok = httpx.post(envoy + "/v1/generate", json={"text": "hi"}, headers={"grpc-timeout": "30S"}, timeout=20)
    assert ok.status_code == 200
    openai = httpx.post(envoy + "/v1/completions", json={"prompt": "hi"}, headers={"grpc-timeout": "x"}, timeout=20)
    assert openai_error(openai, 400)["message"].startswith("invalid grpc-timeout")


@pytest.mark.parametrize("verb", ["cancel", "append"])
def test_an_over_long_or_odd_id_in_a_path_is_a_400_not_a_retryable_429(envoy, verb):
    for rid in ("a" * 20_000, "a" * 129, "a%20b", "a:b"):
        reply = httpx.post(f"{envoy}/v1/requests/{rid}:{verb}", json={}, timeout=10)
        assert reply.status_code == 400, (rid[:20], reply.status_code, reply.text[:200])
        assert reply.json()["code"] == 3 and len(reply.text) < 400
    reply = httpx.post(f"{envoy}/v1/requests/req-1.x_y~z:cancel", json={}, timeout=10)
    assert reply.status_code == 200 and reply.json()["request_id"] == "req-1.x_y~z"


def test_oversized_headers_are_a_per_request_431(envoy):
    for headers in ({"x-big": "a" * 70_000}, {f"x-h{i}": "a" * 1000 for i in range(70)}):
        reply = httpx.post(envoy + "/v1/generate", json={"text": "hi"}, headers=headers, timeout=10)
        assert reply.status_code == 431 and reply.json()["code"] == 8, reply.text[:200]
    target = envoy.removeprefix("http://")
    with grpc.insecure_channel(target) as channel:  # HTTP/2: one stream refused, not the connection
        stub = ipb_grpc.InferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListModels(ipb.ListModelsRequest(), metadata=(("x-big", "a" * 70_000),), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
        assert "request headers are" in info.value.details()
        assert stub.ListModels(ipb.ListModelsRequest(), timeout=5).data[0].id == "fake"


def test_lone_surrogates_in_json_bodies_are_a_400_without_python_text(envoy):
    body = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    reply = httpx.post(envoy + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    err = openai_error(reply, 400)
    assert err["code"] == "invalid_json" and "surrogate" in err["message"]
    assert "Error" not in err["message"] and "codec" not in err["message"]
    native = httpx.post(envoy + "/v1/generate", content=b'{"text": "a\\udc00"}',
                        headers={"content-type": "application/json"})
    assert native.status_code == 400 and native.json()["code"] == 3


def test_undecodable_protobuf_on_the_public_port_is_invalid_argument(envoy):
    with grpc.insecure_channel(envoy.removeprefix("http://")) as channel:
        raw = channel.unary_unary("/mstar.v1.InferenceService/Generate",
                                  request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a\xff\xff\xff\xff\x0f garbage", timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # was UNKNOWN (HTTP 500)


def _curl_grpc(envoy: str, *headers: str, body: bool = True) -> dict[str, str]:
    """One gRPC call (an empty ListModelsRequest, or no message at all) over h2c with exactly these
    headers. Without a body the call is one HEADERS frame: a reply Envoy sends before reading a body
    would otherwise race curl's upload (curl then reports the stream closed, not the reply)."""
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    data = ["--data-binary", "@-"] if body else ["-X", "POST"]
    result = subprocess.run(
        ["curl", "-sv", "--http2-prior-knowledge", "-o", "/dev/null", *data,
         *[arg for h in headers for arg in ("-H", h)], envoy + "/mstar.v1.InferenceService/ListModels"],
        input=b"\x00\x00\x00\x00\x00" if body else b"", capture_output=True, timeout=20)
    # -v shows headers and trailers alike (a trailers-only reply has no separate trailer block).
    lines = [line[2:] for line in result.stderr.decode().splitlines() if line.startswith("< ")]
    found = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}
    assert "grpc-status" in found, result.stderr.decode()[-2000:]
    return found


def test_grpc_without_te_trailers_is_served(envoy):
    # The upstream reset such a stream: the client saw UNAVAILABLE, as if the server were down.
    assert _curl_grpc(envoy, "content-type: application/grpc")["grpc-status"] == "0"


def test_grpc_json_is_a_clear_invalid_argument(envoy):
    trailers = _curl_grpc(envoy, "content-type: application/grpc+json", "te: trailers", body=False)
    assert trailers["grpc-status"] == "3" and "application/grpc+proto" in trailers["grpc-message"]
    assert _curl_grpc(envoy, "content-type: application/grpc+proto", "te: trailers")["grpc-status"] == "0"

def test_envoys_own_429_is_in_each_apis_shape(tmp_path):
    settings = dataclasses.replace(VARIANTS["local"], http_port=free_port(), admin_port=free_port(),
                                   upstream_port=free_port(), rate_limit_rps=1)
    child = start_envoy(settings, tmp_path)  # nothing upstream: the rate limit answers first
    base = f"http://127.0.0.1:{settings.http_port}"
    try:
        readiness.poll("envoy", readiness.http_ok(f"http://127.0.0.1:{settings.admin_port}/ready", "LIVE"), 30,
                       alive=child.alive)
        anthropic = [httpx.post(base + "/v1/messages", json={}, timeout=5) for _ in range(4)]
        limited = [r for r in anthropic if r.status_code == 429]
        assert limited and anthropic_error(limited[0], 429)["type"] == "rate_limit_error"
        responses = [httpx.post(base + "/v1/responses", json={}, timeout=5) for _ in range(4)]
        limited = [r for r in responses if r.status_code == 429]
        assert limited and openai_error(limited[0], 429)["type"] == "rate_limit_error"
    finally:
        child.stop(5)


def test_a_grpc_calls_invalid_grpc_timeout_is_invalid_argument(envoy):
    # Now that the plain gRPC route forwards grpc-timeout as it is, an invalid one must stop at the
    # edge like on HTTP/JSON (forwarded, it broke the shared upstream connection's decoding).
    for bad in ("abc", "-1S", "123456789S"):
        trailers = _curl_grpc(envoy, "content-type: application/grpc", "te: trailers", f"grpc-timeout: {bad}",
                              body=False)
        assert trailers["grpc-status"] == "3" and "grpc-timeout" in trailers["grpc-message"], trailers
    assert _curl_grpc(envoy, "content-type: application/grpc", "te: trailers", "grpc-timeout: 5S")["grpc-status"] == "0"
