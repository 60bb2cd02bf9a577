"""The Envoy edge's answers for what no route serves and what the codec would drop (issue 28):
an unknown path in its API's error shape, too many request headers a 431 / RESOURCE_EXHAUSTED
over HTTP/1.1 and HTTP/2 alike, gRPC-Web served (unary and server streaming, binary and text),
API-key names that stay stable, and the identity a fronting proxy may pass. Real Envoy in front
of fake_upstream.py (the real HTTP surfaces, the real Responses store)."""

from __future__ import annotations

import base64
import dataclasses
import shutil
import struct
import subprocess

import grpc
import httpx
import pytest
import yaml
from envoy_harness import anthropic_error, in_front_of_fake, native_error, openai_error
from mstar.v1 import inference_service_pb2 as ipb
from mstar.v1 import inference_service_pb2_grpc as ipb_grpc

from deploy.envoy import render


@pytest.fixture(scope="module")
def envoy(tmp_path_factory):
    with in_front_of_fake(tmp_path_factory.mktemp("edge")) as base:
        yield base


# ---- unknown paths


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/foo"), ("POST", "/v1/foo"), ("DELETE", "/v1/foo/bar"), ("GET", "/v1"), ("PUT", "/v1/models"),
    ("GET", "/v1/responses/resp_1/nope"), ("GET", "/v1/foo?x=1"),
])
def test_an_unknown_v1_path_is_an_openai_404(envoy, method, path):
    err = openai_error(httpx.request(method, envoy + path, timeout=10), 404)
    assert err == {"message": f"Invalid URL ({method} {path})", "type": "not_found_error", "code": "unknown_route",
                   "param": None}


def test_a_multi_segment_model_name_reaches_the_model_lookup(envoy):
    # `/v1/models/{model=**}`: a Hugging Face repo id (ORG/NAME) is one model name, not an unknown route.
    err = openai_error(httpx.get(envoy + "/v1/models/org/other", timeout=10), 404)
    assert err["code"] == "model_not_found"


def test_an_unknown_path_is_404_whatever_the_body_declares(envoy):
    # Not 415: a wrong path is the first thing wrong with it.
    reply = httpx.post(envoy + "/v1/foo", content=b"a=b", headers={"content-type": "text/plain"}, timeout=10)
    assert openai_error(reply, 404)["code"] == "unknown_route"


def test_an_unknown_paths_echo_is_bounded(envoy):
    err = openai_error(httpx.get(envoy + "/v1/" + "a" * 20_000, timeout=10), 404)
    assert err["message"].startswith("Invalid URL (GET /v1/aaa") and len(err["message"]) < 300


@pytest.mark.parametrize("path", ["/v1/messages/batches", "/v1/messages/count_tokens/x"])
def test_an_unknown_path_under_messages_is_an_anthropic_404(envoy, path):
    assert anthropic_error(httpx.get(envoy + path, timeout=10), 404) == {
        "type": "not_found_error", "message": f"Invalid URL (GET {path})"}


def test_paths_no_api_owns_keep_the_native_shape(envoy):
    for path in ("/no/such/route", "/v1/requests/abc"):  # GET on the native id routes: no such method
        body = native_error(httpx.get(envoy + path, timeout=10), 404, code=5)
        assert body["details"][0]["reason"] == "UNKNOWN_ROUTE" and body["message"] == f"Invalid URL (GET {path})"
    assert httpx.post(envoy + "/v1/generate", content=b"a", headers={"content-type": "text/plain"}).status_code == 415


# ---- too many request headers


def many(n: int) -> dict[str, str]:
    return {f"x-h{i}": "v" for i in range(n)}


def test_too_many_headers_over_http1_are_a_431_in_each_apis_shape(envoy):
    err = openai_error(httpx.get(envoy + "/v1/models", headers=many(500), timeout=10), 431)
    assert err["code"] == "request_headers_too_large" and "the limit is 100" in err["message"]
    assert "header fields" in anthropic_error(
        httpx.post(envoy + "/v1/messages", json={}, headers=many(500), timeout=10), 431)["message"]
    native_error(httpx.post(envoy + "/v1/generate", json={"text": "hi"}, headers=many(500), timeout=10), 431, code=8)
    assert httpx.get(envoy + "/v1/models", headers=many(90), timeout=10).status_code == 200


def _curl_h2(url: str, headers: dict[str, str]) -> tuple[int, str]:
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    args = [arg for k, v in headers.items() for arg in ("-H", f"{k}: {v}")]
    result = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-w", "\n%{http_code}", *args, url],
                            capture_output=True, text=True, timeout=20)
    body, _, status = result.stdout.rpartition("\n")
    return int(status), body


def test_too_many_headers_over_h2_are_a_431_not_a_reset_stream(envoy):
    # The codec's own count limit (100) reset the stream: no response at all.
    status, body = _curl_h2(envoy + "/v1/models", many(500))
    assert status == 431 and '"code":"request_headers_too_large"' in body, (status, body)
    assert _curl_h2(envoy + "/v1/models", many(90))[0] == 200


def test_too_many_grpc_metadata_entries_are_resource_exhausted_not_internal(envoy):
    with grpc.insecure_channel(envoy.removeprefix("http://")) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListModels(ipb.ListModelsRequest(), metadata=list(many(500).items()), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
        assert "header fields" in info.value.details()
        assert stub.ListModels(ipb.ListModelsRequest(), timeout=5).data[0].id == "fake"  # same connection


def test_the_codec_count_never_trips_before_the_policy():
    settings = render.VARIANTS["local"]
    config = yaml.safe_load(render.render(settings))
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    codec_count = hcm["common_http_protocol_options"]["max_headers_count"]
    # HTTP/2 can carry at most codec_kb * 1024 / 32 fields (RFC 7541 accounting) under the byte limit.
    assert codec_count >= hcm["max_request_headers_kb"] * 1024 // 32 > settings.max_request_headers_count


# ---- gRPC-Web


def grpc_web(envoy: str, method: str, message, text: bool = False) -> tuple[httpx.Response, list[tuple[int, bytes]]]:
    """One gRPC-Web call over HTTP/1.1; its frames as (flags, payload)."""
    data = message.SerializeToString()
    body = b"\x00" + struct.pack(">I", len(data)) + data
    kind = "application/grpc-web-text" if text else "application/grpc-web+proto"
    reply = httpx.post(f"{envoy}/mstar.v1.InferenceService/{method}", timeout=10,
                       content=base64.b64encode(body) if text else body,
                       headers={"content-type": kind, "accept": kind, "x-grpc-web": "1"})
    raw = reply.content
    if text:  # each flushed chunk is base64 of its own
        raw = b"".join(base64.b64decode(part + b"=" * (-len(part) % 4)) for part in raw.split(b"=") if part)
    frames, at = [], 0
    while at < len(raw):
        flags, size = raw[at], struct.unpack(">I", raw[at + 1:at + 5])[0]
        frames.append((flags, raw[at + 5:at + 5 + size]))
        at += 5 + size
    return reply, frames


def test_grpc_web_unary_and_server_streaming_are_served(envoy):
    reply, frames = grpc_web(envoy, "ListModels", ipb.ListModelsRequest())
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/grpc-web")
    assert ipb.ListModelsResponse.FromString(frames[0][1]).data[0].id == "fake"
    assert frames[-1][0] == 0x80 and b"grpc-status:0" in frames[-1][1]  # the trailers, in the body
    reply, frames = grpc_web(envoy, "GenerateStream", ipb.GenerateStreamRequest(input={"text": "hi"}))
    events = [ipb.GenerateStreamResponse.FromString(payload) for flags, payload in frames if flags == 0]
    assert "".join(e.chunk.text for e in events) == "Hello world" and events[-1].HasField("complete")
    assert b"grpc-status:0" in frames[-1][1]


def test_grpc_web_text_is_served(envoy):
    reply, frames = grpc_web(envoy, "ListModels", ipb.ListModelsRequest(), text=True)
    assert reply.headers["content-type"].startswith("application/grpc-web-text")
    assert ipb.ListModelsResponse.FromString(frames[0][1]).data[0].id == "fake"


@pytest.mark.parametrize("kind", ["application/grpc-web", "application/grpc-web-text", "application/grpc-web+json"])
def test_grpc_web_on_an_http_api_route_is_a_415_in_its_shape(envoy, kind):
    # It was a 200 carrying grpc-status in a header: success, to an HTTP client.
    headers = {"content-type": kind}
    err = openai_error(httpx.post(envoy + "/v1/chat/completions", content=b"{}", headers=headers, timeout=10), 415)
    assert err["code"] == "unsupported_media_type"
    anthropic_error(httpx.post(envoy + "/v1/messages", content=b"{}", headers=headers, timeout=10), 415)
    native_error(httpx.post(envoy + "/v1/generate", content=b"{}", headers=headers, timeout=10), 415, code=3)


def test_grpc_web_with_a_json_subtype_is_a_415(envoy):
    reply = httpx.post(envoy + "/mstar.v1.InferenceService/ListModels", content=b"{}",
                       headers={"content-type": "application/grpc-web+json"}, timeout=10)
    assert "protobuf only" in native_error(reply, 415, code=3)["message"]


def test_grpc_web_errors_carry_their_status(envoy):
    reply, _ = grpc_web(envoy, "GenerateStream", ipb.GenerateStreamRequest(input={"text": "too long"}))
    assert reply.headers["grpc-status"] == "3" and "9000 tokens" in reply.headers["grpc-message"]
    reply, _ = grpc_web(envoy, "NoSuchMethod", ipb.ListModelsRequest())
    assert reply.headers["grpc-status"] == "12"


# ---- API keys and identities


def test_key_names_are_a_stable_digest_whatever_the_key_list():
    def names(keys):
        (auth,) = render.security_filters(dataclasses.replace(render.VARIANTS["local"], api_keys=keys))
        return {c["key"]: c["client"] for c in auth["typed_config"]["credentials"]}

    first, reordered = names(("k1", "k2")), names(("k2", "k0", "k1", "k1"))
    assert reordered["k1"] == first["k1"] and reordered["k2"] == first["k2"] and len(reordered) == 3
    assert first["k1"].startswith("key-") and len(first["k1"]) == 20 and "k1" not in first["k1"][4:]
    assert len(set(reordered.values())) == 3


def test_a_config_with_keys_is_readable_by_its_owner_only(tmp_path):
    with_keys = render.write(dataclasses.replace(render.VARIANTS["local"], api_keys=("k",)), tmp_path / "a.yaml")
    without = render.write(render.VARIANTS["local"], tmp_path / "b.yaml")
    assert with_keys.stat().st_mode & 0o777 == 0o600 and without.stat().st_mode & 0o077 != 0


def _owned_round_trip(base: str, owner: dict, other: dict) -> tuple[int, int]:
    """(status of `other` reading `owner`'s stored response, status of `owner` reading it)."""
    created = httpx.post(base + "/v1/responses", json={"model": "m", "input": "hi"}, headers=owner, timeout=10)
    assert created.status_code == 200, created.text
    rid = created.json()["id"]
    return (httpx.get(f"{base}/v1/responses/{rid}", headers=other, timeout=10).status_code,
            httpx.get(f"{base}/v1/responses/{rid}", headers=owner, timeout=10).status_code)


def test_keys_own_their_responses_and_a_claimed_identity_changes_nothing(tmp_path):
    with in_front_of_fake(tmp_path, api_keys=("key-one", "key-two")) as base:
        a, b = {"authorization": "Bearer key-one"}, {"x-api-key": "key-two"}
        assert _owned_round_trip(base, a, b) == (404, 200)
        posing = {**b, "x-mstar-client": render.api_key_client("key-one")}  # B claims A's name
        assert _owned_round_trip(base, a, posing) == (404, 200)
        reply, _ = grpc_web(base, "ListModels", ipb.ListModelsRequest())  # gRPC-Web needs a key too
        assert reply.status_code == 401 and reply.headers["grpc-status"] == "16"


def test_a_fronting_proxys_identity_passes_only_when_trusted(tmp_path):
    alice, bob = {"x-mstar-client": "user-alice"}, {"x-mstar-client": "user-bob"}
    with in_front_of_fake(tmp_path / "trusted", trust_client_identity=True) as base:
        assert _owned_round_trip(base, alice, bob) == (404, 200)
    with in_front_of_fake(tmp_path / "default") as base:  # removed: everyone is the anonymous principal
        assert _owned_round_trip(base, alice, bob) == (200, 200)
