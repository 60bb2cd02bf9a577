"""Issue 28 through real Envoy (the null-engine rig): an unknown field on a native HTTP route is a
400 naming it (the transcoder alone would drop it and serve the request), gRPC clients of the
same RPCs are unaffected, a clamped max_tokens reaches every surface's client as a Warning
header, and the documented maximum of embeddings comes back as one body."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.preprocess.surfaces.openai.embeddings import FRAME_BYTES, MAX_INPUTS
from tests.reliability.test_validation import CONTEXT, engine_untouched

pytestmark = pytest.mark.reliability


@pytest.fixture
def client(rig):
    with httpx.Client(base_url=rig.http, timeout=60) as c:
        yield c
    rig.check_recovered()


def _named(reply: httpx.Response, field: str) -> dict:
    assert reply.status_code == 400, (reply.status_code, reply.text[:300])
    body = reply.json()
    assert body["code"] == 3 and body["message"] == f"{field}: unknown field", body
    assert body["details"][0]["reason"] == "UNKNOWN_FIELD" and body["details"][0]["metadata"]["field"] == field
    return body


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/generate", {"text": "hi", "max_token": 3}, "input.max_token"),
    ("/v1/generate", {"text": "hi", "model_kwargs": {"sampling": {"max_token": 3}}}, "input.model_kwargs.sampling.max_token"),
    ("/v1/generate", {"input": {"text": "hi"}}, "input.input"),  # the gRPC wrapper is not part of the body
    ("/v1/generate_stream", {"messages": [{"role": "user", "contnet": "hi"}]}, "input.messages[0].contnet"),
    ("/v1/requests/some-id:append", {"txt": "more"}, "append.txt"),
    ("/v1/requests/some-id:cancel", {"reason": "typo"}, "reason"),
])
def test_an_unknown_native_field_is_a_400_naming_it(rig, client, path, body, field):
    with engine_untouched(rig):
        _named(client.post(path, json=body), field)


def test_known_spellings_still_work(client):
    camel = client.post("/v1/generate", json={"text": "hi", "modelKwargs": {"sampling": {"maxTokens": 2}}})
    assert camel.status_code == 200 and camel.json()["complete"]["usage"]["completion_tokens"] == 2
    assert client.post("/v1/requests/nobody:cancel").json() == {"request_id": "nobody", "cancelled": False}
    missing = client.post("/v1/requests/nobody:append", json={"text": "x"})
    assert missing.status_code == 404 and missing.json()["details"][0]["reason"] == "REQUEST_NOT_FOUND"


def test_a_session_refuses_the_action_with_an_unknown_field_and_goes_on(client):
    actions = [{"start": {"client_request_id": "typo", "text": "hi", "max_token": 2}},
               {"start": {"client_request_id": "ok", "text": "hi", "model_kwargs": {"sampling": {"max_tokens": 2}}}}]
    reply = client.post("/v1/session", content=json.dumps(actions).encode(), headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text[:300]
    events = [json.loads(b[6:]) for b in reply.text.split("\n\n") if b.startswith("data: ")]
    refused = [e["failed"] for e in events if "failed" in e]
    assert len(refused) == 1 and refused[0]["request_id"] == "" and refused[0]["reason"] == "UNKNOWN_FIELD"
    assert refused[0]["field"] == "start.max_token" and refused[0]["http_status"] == 400
    assert [e["complete"]["usage"]["completion_tokens"] for e in events if "complete" in e] == [2]
    bad = client.post("/v1/session", content=b'{"start": {"text": "hi"}}', headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "JSON array" in bad.json()["message"]


def test_grpc_clients_of_the_typed_rpcs_are_unaffected(rig):
    with grpc.insecure_channel(rig.grpc) as channel:
        stub = api_grpc.InferenceServiceStub(channel)
        reply = stub.Generate(api.GenerateRequest(input={"text": "hi", "model_kwargs": {"sampling": {"max_tokens": 2}}}),
                              timeout=30)
    assert reply.complete.usage.completion_tokens == 2


def _warnings(reply: httpx.Response) -> list[str]:
    return reply.headers.get_list("warning")


def _chat_prompt_of(client, content: str) -> int:
    return client.post("/tokenize", json={"messages": [{"role": "user", "content": content}]}).json()["count"]


def _filling_chat_content(client, room: int) -> str:
    """Chat content whose templated prompt leaves exactly `room` tokens of the context."""
    words = CONTEXT - room - _chat_prompt_of(client, "")
    for _ in range(8):
        count = _chat_prompt_of(client, "hi " * words)
        if count == CONTEXT - room:
            return "hi " * words
        words += CONTEXT - room - count
    raise AssertionError("could not fill the context")


def test_a_clamp_reaches_every_surface_as_a_warning_header(client):
    content = _filling_chat_content(client, room=2)  # every request below is clamped to 2 tokens
    messages = [{"role": "user", "content": content}]
    replies = {
        "chat": client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 50}),
        "chat (max_completion_tokens)": client.post("/v1/chat/completions",
                                                    json={"messages": messages, "max_completion_tokens": 50}),
        "completions": client.post("/v1/completions", json={"prompt": [100] * (CONTEXT - 2), "max_tokens": 50}),
        "messages": client.post("/v1/messages", json={"model": "default", "messages": messages, "max_tokens": 50}),
        "responses": client.post("/v1/responses", json={"input": content, "max_output_tokens": 50, "store": False}),
        "native": client.post("/v1/generate", json={
            "prompt_parts": [{"token_ids": {"ids": [100] * (CONTEXT - 2)}}], "model_kwargs": {"sampling": {"max_tokens": 50}}}),
    }
    named = {"chat": "max_tokens", "chat (max_completion_tokens)": "max_completion_tokens", "completions": "max_tokens",
             "messages": "max_tokens", "responses": "max_output_tokens", "native": "max_tokens"}
    for surface, reply in replies.items():
        assert reply.status_code == 200, (surface, reply.text[:300])
        assert _warnings(reply) == [f'299 - "{named[surface]} clamped to 2"'], (surface, reply.headers)
    assert replies["native"].json()["complete"]["warnings"] == ["max_tokens clamped to 2"]
    with client.stream("POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 50, "stream": True}) as r:
        assert _warnings(r) == ['299 - "max_tokens clamped to 2"'] and "data: [DONE]" in r.read().decode()
    with client.stream("POST", "/v1/generate_stream", json={
            "prompt_parts": [{"token_ids": {"ids": [100] * (CONTEXT - 2)}}], "model_kwargs": {"sampling": {"max_tokens": 50}}}) as r:
        assert _warnings(r) == ['299 - "max_tokens clamped to 2"'] and '"complete"' in r.read().decode()
    unclamped = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert unclamped.status_code == 200 and not _warnings(unclamped)


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_the_documented_most_embeddings_come_back_whole_through_envoy(client, encoding):
    """2,048 inputs (docs/http.md, the schema's maximum): one body, joined by Envoy from several
    HttpBody messages of about FRAME_BYTES. The null engine's vectors print short; the real model's
    25 MB body (past the 16 MiB gRPC cap this used to hit) is tests/e2e/test_embeddings_max_e2e.py."""
    reply = client.post("/v1/embeddings", json={"input": [[i % 1000 + 1] for i in range(MAX_INPUTS)],
                                                "encoding_format": encoding}, timeout=300)
    assert reply.status_code == 200, reply.text[:300]
    assert len(reply.content) > 4 * FRAME_BYTES  # several messages on the gRPC side
    body = reply.json()
    assert [d["index"] for d in body["data"]] == list(range(MAX_INPUTS))
    assert body["usage"] == {"prompt_tokens": MAX_INPUTS, "total_tokens": MAX_INPUTS}
    one_more = client.post("/v1/embeddings", json={"input": ["x"] * (MAX_INPUTS + 1)})
    assert one_more.status_code == 400 and one_more.json()["error"]["param"] == "input"
