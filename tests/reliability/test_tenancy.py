"""Stored data belongs to whoever stored it (issue 28): a real stack (services.stack, as `make
run` starts it, with two API keys; the null engine: storage semantics need no model) where key A
stores responses and key B can neither read, continue, cancel nor delete them: every attempt is
the same 404, byte for byte, as for an id that never existed. No key is a 401; /health is open."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from deploy.envoy.render import api_key_client
from services.stack import Stack, StackConfig
from tests.reliability.conftest import NULL_STEP

pytestmark = pytest.mark.reliability

KEY_A, KEY_B = "sk-tenant-a-0123456789", "sk-tenant-b-9876543210"
A = {"authorization": f"Bearer {KEY_A}"}
B = {"x-api-key": KEY_B}  # the other accepted spelling
NEVER = "resp_00000000000000000000000000000000"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("tenancy")
    config = StackConfig.with_free_ports(null_engine=True, api_keys=(KEY_A, KEY_B), log_dir=tmp / "logs",
                                         data_dir=tmp / "data", generation_args=list(NULL_STEP),
                                         ready_timeout_s=300.0)
    with Stack(config) as started:
        yield started


@pytest.fixture
def http(stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.http_url, timeout=30) as client:
        yield client


def store_one(http: httpx.Client, **fields) -> dict:
    reply = http.post("/v1/responses", headers=A, json={"model": "default", "input": "Hi", "max_output_tokens": 4,
                                                        **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()


def same_as_never(http: httpx.Client, method: str, path: str, headers: dict, **kw) -> None:
    """B's answer for A's id is the answer for an id nobody ever stored, to the byte (an answer
    that echoes the path the client sent echoes each its own id)."""
    rid = path.split("/")[3]
    theirs = http.request(method, path, headers=headers, **kw)
    never = http.request(method, path.replace(rid, NEVER), headers=headers, **kw)
    assert theirs.status_code == never.status_code == 404, (method, path, theirs.text)
    assert theirs.content.replace(rid.encode(), NEVER.encode()) == never.content
    assert theirs.headers["content-type"] == never.headers["content-type"]
    assert set(theirs.json()) == {"error"}, theirs.text  # OpenAI's shape


def test_without_a_key_only_health_answers(http):
    assert http.get("/health").status_code == 200
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/responses"), ("GET", f"/v1/responses/{NEVER}")):
        reply = http.request(method, path, json={} if method == "POST" else None)
        assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error", reply.text
    assert http.get("/v1/models", headers={"authorization": "Bearer sk-wrong"}).status_code == 401


def test_another_key_cannot_read_continue_cancel_or_delete(http):
    rid = store_one(http)["id"]
    for headers in (B, {**B, "x-mstar-client": api_key_client(KEY_A)}):  # also when B claims A's name
        same_as_never(http, "GET", f"/v1/responses/{rid}", headers)
        same_as_never(http, "POST", f"/v1/responses/{rid}/cancel", headers)
        same_as_never(http, "DELETE", f"/v1/responses/{rid}", headers)
        # input_items is not served yet (404 for everyone); it must stay a 404 for B once it is.
        same_as_never(http, "GET", f"/v1/responses/{rid}/input_items", headers)
        body = {"model": "default", "input": "More", "max_output_tokens": 4}
        theirs = http.post("/v1/responses", headers=headers, json={**body, "previous_response_id": rid})
        never = http.post("/v1/responses", headers=headers, json={**body, "previous_response_id": NEVER})
        assert theirs.status_code == never.status_code == 404 and theirs.content == never.content, theirs.text
        assert theirs.json()["error"]["param"] == "previous_response_id"
    # A still has all of it.
    assert http.get(f"/v1/responses/{rid}", headers=A).json()["id"] == rid
    again = http.post("/v1/responses", headers=A, json={"model": "default", "input": "More", "max_output_tokens": 4,
                                                         "previous_response_id": rid})
    assert again.status_code == 200 and again.json()["previous_response_id"] == rid
    assert http.post(f"/v1/responses/{rid}/cancel", headers=A).json()["id"] == rid
    assert http.delete(f"/v1/responses/{rid}", headers=A).json()["deleted"] is True
    assert http.get(f"/v1/responses/{rid}", headers=A).status_code == 404


def test_another_key_cannot_cancel_a_running_response(stack, http):
    # 400 tokens at 20 ms a step: the stream runs for ~8 s unless cancelled.
    started, events = threading.Event(), []
    rid: list[str] = []

    def stream() -> None:
        client = openai.OpenAI(base_url=stack.http_url + "/v1", api_key=KEY_A, max_retries=0)
        for event in client.responses.create(model="default", input="Count.", max_output_tokens=400, stream=True):
            if event.type == "response.created":
                rid.append(event.response.id)
                started.set()
            events.append(event)

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert started.wait(30)
        time.sleep(0.3)
        same_as_never(http, "POST", f"/v1/responses/{rid[0]}/cancel", B)
        assert reader.is_alive(), "B's cancel ended A's stream"
        assert http.post(f"/v1/responses/{rid[0]}/cancel", headers=A).json()["status"] == "cancelled"
    finally:
        reader.join(30)
    assert events[-1].response.status == "cancelled"


def test_the_sdk_sees_not_found_for_anothers_response(stack):
    a = openai.OpenAI(base_url=stack.http_url + "/v1", api_key=KEY_A, max_retries=0)
    b = openai.OpenAI(base_url=stack.http_url + "/v1", api_key=KEY_B, max_retries=0)
    stored = a.responses.create(model="default", input="Hi", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(stored.id)
    assert a.responses.retrieve(stored.id).id == stored.id
