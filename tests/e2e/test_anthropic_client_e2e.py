"""The official `anthropic` Python SDK, unmodified, against Envoy's /v1/messages: greedy text equals
the chat-completions greedy text for the same messages."""

from __future__ import annotations

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]
GREEDY = {"temperature": 0}  # newer SDKs take sampling parameters only through extra_body


@pytest.fixture(scope="module")
def client(stack):
    return anthropic.Anthropic(base_url=stack.http_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def chat_text(stack):
    reply = httpx.post(stack.http_url + "/v1/chat/completions", timeout=60, json={
        "model": "default", "messages": MESSAGES, "max_tokens": 16, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_non_stream_equals_chat_completions(client, chat_text):
    msg = client.messages.create(model="default", max_tokens=16, messages=MESSAGES, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].text == chat_text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens <= 16
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 0


def test_messages_stream_equals_non_stream(client, chat_text):
    with client.messages.stream(model="default", max_tokens=16, messages=MESSAGES, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == chat_text == final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens <= 16


def test_stop_sequences(client, chat_text):
    words = chat_text.split()
    assert len(words) > 2, chat_text
    stop = " " + words[2]
    msg = client.messages.create(model="default", max_tokens=16, messages=MESSAGES, stop_sequences=[stop],
                                 extra_body=GREEDY)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == chat_text[: chat_text.index(stop)]


def test_missing_max_tokens_is_400_in_anthropics_shape(client, stack):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="default", messages=MESSAGES, max_tokens=anthropic.omit)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in info.value.body["error"]["message"]


def test_count_tokens(client):
    counted = client.messages.count_tokens(model="default", messages=MESSAGES)
    msg = client.messages.create(model="default", max_tokens=1, messages=MESSAGES)
    assert counted.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)


def test_envoy_errors_on_the_route_are_anthropic_shaped(stack):
    reply = httpx.post(stack.http_url + "/v1/messages", content=b"x" * (5 * 1024 * 1024), timeout=30,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 413 and reply.json()["type"] == "error", reply.text
    assert reply.json()["error"]["type"] == "request_too_large"
    reply = httpx.post(stack.http_url + "/v1/messages", content=b"{}", timeout=30,
                       headers={"content-type": "text/plain"})
    assert reply.status_code == 415 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
