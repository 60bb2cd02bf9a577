"""Images through the real stack (Envoy + both services) on an Idefics3 checkpoint directory as
`MSTAR_MODEL=dir make run` serves it: a small random-init vision tower of the real geometry, a
tiny Llama decoder, SmolLM2's tokenizer with SmolVLM's image tokens added. A native `/v1/generate`
whose prompt_parts hold text and a PNG (base64 `data`, as the JSON mapping of bytes) continues
exactly as transformers' Idefics3 does with its own image processor; a corrupt image is a 400
naming the part; /v1/models says the model takes images."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from services.preprocess.images import prompt_for_image
from services.preprocess.model import default_model_path, read_gguf_metadata
from services.preprocess.tokenizer import Tokenizer
from services.stack.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
PROCESSOR = {"size": {"longest_edge": 1024}, "max_image_size": {"longest_edge": 512}, "do_image_splitting": True}
# SmolVLM's (Idefics3's) chat template: content is a list of parts, "<image>" for each image.
TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] "
            "== 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == "
            "'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
            "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


def write_model(directory: Path):
    meta = read_gguf_metadata(default_model_path())
    backend = Tokenizer.from_gguf_fields(meta)._backend
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS])
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    (directory / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    config = transformers.Idefics3Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=512, patch_size=16),
        text_config=dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=backend.get_vocab_size(),
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2),
        scale_factor=4, image_token_id=backend.token_to_id("<image>"))
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(str(directory))
    return model, backend


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("idefics3-tiny")
    model, backend = write_model(directory)
    stack = Stack(StackConfig.with_free_ports(model=str(directory), log_dir=directory / "logs", dtype="float32",
                                              ready_timeout_s=300.0))
    stack.start()
    try:
        yield stack, model, backend
    finally:
        stack.stop(grace_s=5.0)


def png(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def hf_greedy(model, backend, text: str, picture: bytes, n: int) -> tuple[list[int], list[int]]:
    from PIL import Image

    processor = transformers.Idefics3ImageProcessorPil(**PROCESSOR)
    inputs = processor(Image.open(io.BytesIO(picture)), return_tensors="pt", return_row_col_info=True)
    rows, cols = inputs["rows"][0][0], inputs["cols"][0][0]
    ids = backend.encode(text + prompt_for_image(rows, cols, 64), add_special_tokens=False).ids
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), pixel_values=inputs["pixel_values"], max_new_tokens=n,
                             do_sample=False, eos_token_id=None)
    return ids, out[0, len(ids):].tolist()


def test_models_say_it_takes_images(served):
    stack, _, _ = served
    model = httpx.get(stack.http_url + "/v1/models", timeout=30).json()["data"][0]
    assert model["input_modalities"] == ["image", "text"], model


QUESTION = [{"type": "text", "text": "What is in "}, {"type": "image"}, {"type": "text", "text": " here?"}]


def hf_chat(stack, model, picture: bytes, n: int, hf_messages=None) -> tuple[str, int]:
    """transformers' whole pipeline on a conversation (default: one user turn "What is in <image>
    here?"): Idefics3Processor's chat template, image processor and prompt expansion, then
    generate. (text, prompt tokens)."""
    from PIL import Image

    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(stack.config.model) / "tokenizer.json"))
    processor = transformers.Idefics3Processor(transformers.Idefics3ImageProcessorPil(**PROCESSOR), hf_tokenizer,
                                               image_seq_len=64, chat_template=TEMPLATE)
    hf_messages = hf_messages or [{"role": "user", "content": QUESTION}]
    text = processor.apply_chat_template(hf_messages, add_generation_prompt=True)
    inputs = processor(text=text, images=[[Image.open(io.BytesIO(picture))]], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, eos_token_id=None)
    prompt_len = inputs["input_ids"].shape[1]
    return hf_tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True), prompt_len


def test_openai_chat_with_an_image_through_the_sdk_is_transformers_processor_and_model(served):
    import openai

    stack, model, _ = served
    picture = png(200, 300, seed=1)
    want, prompt_len = hf_chat(stack, model, picture, 6)
    client = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="none", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    reply = client.chat.completions.create(model="default", max_tokens=6, temperature=0, extra_body={"ignore_eos": True},
                                           messages=[{"role": "user", "content": [
                                               {"type": "text", "text": "What is in "},
                                               {"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": " here?"}]}])
    assert reply.choices[0].message.content == want
    assert reply.usage.prompt_tokens == prompt_len


def test_anthropic_messages_with_an_image_block_through_the_sdk_is_transformers(served):
    import anthropic

    stack, model, _ = served
    picture = png(640, 480, seed=2)  # 2 x 1 tiles here: another grid than the OpenAI test's
    want, prompt_len = hf_chat(stack, model, picture, 6)
    client = anthropic.Anthropic(base_url=stack.http_url, api_key="none", max_retries=0)
    reply = client.messages.create(model="default", max_tokens=6, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": [
                                       {"type": "text", "text": "What is in "},
                                       {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                    "data": base64.b64encode(picture).decode()}},
                                       {"type": "text", "text": " here?"}]}])
    assert reply.content[0].text == want
    assert reply.usage.input_tokens == prompt_len
    count = client.messages.count_tokens(model="default", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in "},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(picture).decode()}},
        {"type": "text", "text": " here?"}]}])
    assert count.input_tokens == prompt_len


def test_responses_input_image_and_a_follow_up_that_still_sees_it(served):
    """The Responses API through the SDK: an input_image, then a turn chained by
    previous_response_id whose stored conversation keeps the image (transformers gets the whole
    conversation, image included)."""
    import openai

    stack, model, _ = served
    picture = png(320, 240, seed=3)
    want, prompt_len = hf_chat(stack, model, picture, 5)
    client = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="none", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    first = client.responses.create(model="default", max_output_tokens=5, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is in "},
                                     {"type": "input_image", "image_url": url},
                                     {"type": "input_text", "text": " here?"}]}])
    assert first.output_text == want and first.usage.input_tokens == prompt_len
    conversation = [{"role": "user", "content": QUESTION},
                    {"role": "assistant", "content": [{"type": "text", "text": first.output_text}]},
                    {"role": "user", "content": [{"type": "text", "text": "And then?"}]}]
    want_next, next_len = hf_chat(stack, model, picture, 4, conversation)
    second = client.responses.create(model="default", max_output_tokens=4, temperature=0,
                                     previous_response_id=first.id, input="And then?")
    assert second.output_text == want_next and second.usage.input_tokens == next_len


def test_an_anthropic_url_image_is_refused_naming_the_block(served):
    stack, _, _ = served
    body = {"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}
    reply = httpx.post(stack.http_url + "/v1/messages", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "messages[0].content[0].source" in reply.text and "fetches no image URLs" in reply.text, reply.text


@pytest.mark.parametrize("url, words", [("https://example.com/cat.png", "fetches no image URLs"),
                                        ("data:image/png;base64,@@@", "base64"),
                                        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(),
                                         "image")])
def test_a_bad_image_url_is_a_400_in_openais_shape_naming_the_part(served, url, words):
    stack, _, _ = served
    body = {"model": "default", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    reply = httpx.post(stack.http_url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages[0].content[1].image_url.url" and words in error["message"], error


def test_native_generate_with_an_image_is_transformers(served):
    stack, model, backend = served
    picture = png(300, 200)
    ids, want = hf_greedy(model, backend, "Describe this: ", picture, 8)
    body = {"prompt_parts": [{"modality": "MODALITY_TEXT", "text": "Describe this: "},
                             {"modality": "MODALITY_IMAGE", "data": base64.b64encode(picture).decode(),
                              "mime_type": "image/png"}],
            "model_kwargs": {"sampling": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}}}
    reply = httpx.post(stack.http_url + "/v1/generate", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    assert (got.get("token_ids") or got.get("tokenIds")) == want
    assert got["complete"]["usage"]["prompt_tokens"] == len(ids), got["complete"]  # image tokens counted


def test_a_corrupt_image_is_a_400_naming_the_part(served):
    stack, _, _ = served
    body = {"prompt_parts": [{"modality": "MODALITY_TEXT", "text": "Describe: "},
                             {"modality": "MODALITY_IMAGE", "data": base64.b64encode(b"\x89PNG not really").decode()}],
            "model_kwargs": {"sampling": {"max_tokens": 4}}}
    reply = httpx.post(stack.http_url + "/v1/generate", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "prompt_parts[1]" in reply.text, reply.text


def test_an_image_url_is_never_fetched(served):
    """A local HTTP server named by an image_url sees no request: nothing is fetched server-side."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stack, _, _ = served
        url = f"http://127.0.0.1:{server.server_address[1]}/cat.png"
        body = {"model": "default", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
        reply = httpx.post(stack.http_url + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 400 and "fetches no image URLs" in reply.text, reply.text
    finally:
        server.shutdown()
    assert seen == []


def test_a_text_only_model_answers_an_image_with_a_400(stack):
    """The embedded default (SmolLM2, text only) names the part it cannot take."""
    url = "data:image/png;base64," + base64.b64encode(png(8, 8)).decode()
    body = {"model": "default", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    reply = httpx.post(stack.http_url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages[0].content[1].image_url.url" and "not accepted" in error["message"], error
