"""The official `openai` client's Responses API against Envoy's /v1/responses: greedy text equals
the chat-completions greedy text, stream and not; stored conversations survive a restart of
the preprocess service."""

from __future__ import annotations

import httpx
import openai
import pytest

from services.stack import readiness

pytestmark = pytest.mark.e2e

PROMPT = "Write one short sentence about the sea."


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat_greedy(client, messages, max_tokens=16) -> str:
    reply = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                           temperature=0)
    return reply.choices[0].message.content


def test_create_equals_chat_completions(client):
    expected = chat_greedy(client, [{"role": "user", "content": PROMPT}])
    response = client.responses.create(model="default", input=PROMPT, max_output_tokens=16, temperature=0)
    assert response.output_text == expected and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.usage.output_tokens <= 16
    assert client.responses.retrieve(response.id).output_text == expected


def test_stream_equals_non_stream(client):
    expected = chat_greedy(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}])
    events = list(client.responses.create(model="default", input=PROMPT, instructions="Be brief.",
                                          max_output_tokens=16, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    assert events[-1].response.output_text == expected


def test_previous_response_id_across_a_preprocess_restart(client, stack):
    first = client.responses.create(model="default", input=PROMPT, max_output_tokens=8, temperature=0)
    stack.children["preprocess"].stop()
    stack.restart("preprocess")
    readiness.poll("preprocess", stack.ready_check("preprocess"), 120)
    readiness.poll("envoy_upstream", readiness.http_ok(stack.http_url + "/health"), 60)
    second = client.responses.create(model="default", input="And one more.", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    expected = chat_greedy(client, [{"role": "user", "content": PROMPT},
                                    {"role": "assistant", "content": first.output_text},
                                    {"role": "user", "content": "And one more."}], max_tokens=8)
    assert second.output_text == expected and second.previous_response_id == first.id


def test_store_false_delete_and_not_found(client, stack):
    unstored = client.responses.create(model="default", input=PROMPT, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    kept = client.responses.create(model="default", input=PROMPT, max_output_tokens=2)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    reply = httpx.post(stack.http_url + "/v1/responses", json={"model": "default", "input": PROMPT,
                                                               "max_output_tokens": 2, "frobnicate": 1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "frobnicate"


def test_models_retrieve(client):
    name = client.models.list().data[0].id
    model = client.models.retrieve(name)
    assert model.id == name and isinstance(model.created, int)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
