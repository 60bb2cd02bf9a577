"""The official `openai` Python client, unmodified, against Envoy's OpenAI-compatible routes."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models(client):
    models = client.models.list().data
    assert models and models[0].object == "model"


def test_the_model_answers_to_its_hugging_face_name(client):
    """SDK code written for vLLM or the Hub passes the repo id; it selects the served model."""
    served = client.models.list().data[0].id
    hf = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert client.models.retrieve(hf).id == served  # a two-segment path: /v1/models/ORG/NAME
    reply = client.chat.completions.create(model=hf, messages=MESSAGES, max_tokens=3)
    assert reply.model == hf and reply.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="HuggingFaceTB/SmolLM2-360M-Instruct", messages=MESSAGES, max_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("HuggingFaceTB/other")


def test_chat_stream_concatenates_to_non_stream_for_the_same_seed(client):
    args = {"model": "default", "messages": MESSAGES, "max_tokens": 12, "temperature": 0.9, "seed": 7}
    whole = client.chat.completions.create(**args)
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens <= 12 and whole.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    deltas, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(deltas) == text
    assert usage.completion_tokens == whole.usage.completion_tokens and finish == whole.choices[0].finish_reason


def test_completions_stream_and_non_stream(client):
    args = {"model": "default", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0.7, "seed": 3,
            "stop": ["\n\n"]}
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.object == "text_completion" and whole.usage.prompt_tokens > 0


def test_n_choices_use_distinct_seeds(client):
    reply = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=6, n=2, seed=11,
                                           temperature=1.0)
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.content for c in reply.choices) and reply.usage.completion_tokens <= 12


def test_errors_raise_the_matching_exceptions(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4, temperature=5)
    assert info.value.status_code == 400 and info.value.param == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=MESSAGES, extra_body={"frobnicate": 1})
