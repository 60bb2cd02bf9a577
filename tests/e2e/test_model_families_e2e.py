"""A model family other than Llama through the real stack (Envoy + both services), from an HF
directory as `MSTAR_MODEL=dir make run` serves it: a tiny random-init Qwen3 (QK-norm, a sliding
window) with the SmolLM2 tokenizer and chat template. Its tokens must be transformers' own
Qwen3ForCausalLM's, with a prompt longer than the window; /v1/models names the family."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import torch

from services.generation.models.config import DecoderConfig
from services.generation.weights.random_init import random_checkpoint, save_hf_dir
from services.preprocess.model import default_model_path, read_gguf_metadata
from services.preprocess.tokenizer import Tokenizer
from services.stack.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")

WINDOW = 8
QWEN3 = DecoderConfig(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=512,
    tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,), family="qwen3",
    sliding_window=WINDOW, layer_types=("sliding_attention", "full_attention"),
)


def write_model(directory: Path):
    """The checkpoint (config.json + safetensors) and SmolLM2's tokenizer as tokenizer.json."""
    checkpoint = random_checkpoint(QWEN3, seed=5, std=0.5)
    save_hf_dir(checkpoint, str(directory))
    meta = read_gguf_metadata(default_model_path())
    Tokenizer.from_gguf_fields(meta)._backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": meta["tokenizer.chat_template"]}))
    return checkpoint


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen3-tiny")
    checkpoint = write_model(directory)
    # fp32 pinned: at auto a dense checkpoint serves in bf16 where the CPU has native bf16, so the
    # tokens would depend on the CPU; fp32 on the cpu kernels is transformers' to the ulp
    stack = Stack(StackConfig.with_free_ports(model=str(directory), log_dir=directory / "logs", dtype="float32",
                                              ready_timeout_s=300.0))
    stack.start()
    try:
        yield stack, checkpoint
    finally:
        stack.stop(grace_s=5.0)


def hf_greedy(checkpoint, prompt: list[int], n: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_config(checkpoint.config.hf_config()).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    model.load_state_dict(checkpoint.state_dict, strict=False)
    model.tie_weights()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_models_name_the_family(served):
    stack, _ = served
    model = httpx.get(stack.http_url + "/v1/models", timeout=30).json()["data"][0]
    assert model["family"] == "qwen3" and model["max_model_len"] == 512, model


def test_native_generate_is_transformers_greedy(served):
    stack, checkpoint = served
    text = "The quick brown fox jumps over the lazy dog because"
    prompt = httpx.post(stack.http_url + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]
    body = {"text": text, "model_kwargs": {"sampling": {"max_tokens": 20, "temperature": 0, "ignore_eos": True}}}
    reply = httpx.post(stack.http_url + "/v1/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    assert len(prompt) > WINDOW
    assert (got.get("token_ids") or got.get("tokenIds")) == hf_greedy(checkpoint, prompt, 20)


def test_openai_chat_through_the_sdk(served):
    stack, checkpoint = served
    client = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Say something."}]
    prompt = httpx.post(stack.http_url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    reply = client.chat.completions.create(model="default", messages=messages, max_tokens=12, temperature=0,
                                           logprobs=True, extra_body={"ignore_eos": True})
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == 12
    tokenizer = Tokenizer.from_json(Path(stack.config.model) / "tokenizer.json")
    expected = hf_greedy(checkpoint, prompt, 12)
    # logprobs' tokens spell the continuation token by token: the same 12 tokens as transformers'
    spelled = [t.token for t in reply.choices[0].logprobs.content]
    assert spelled == [tokenizer._backend.decode([i], skip_special_tokens=False) for i in expected]
