"""Embeddings end to end: the official `openai` client's `embeddings.create` through real Envoy,
and the native gRPC API (output_modalities [MODALITY_EMBEDDING]) through the same Envoy, on the
real default model (SmolLM2-135M-Instruct at its defaults: the GGUF's own Q4_1/Q8_0 codes; mean pooling)."""

from __future__ import annotations

import grpc
import numpy as np
import openai
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

pytestmark = pytest.mark.e2e

HIDDEN = 576  # SmolLM2-135M's hidden size
SENTENCES = ["The cat sat on the mat.", "A kitten is sleeping on the rug.",
             "The stock market fell sharply today.", "Investors sold shares as prices dropped."]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def cos(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_float_and_base64_agree_and_are_unit_vectors(client):
    # The client asks for base64 by default and decodes it; float is the JSON-numbers encoding.
    as_base64 = client.embeddings.create(model="default", input=SENTENCES)
    as_float = client.embeddings.create(model="default", input=SENTENCES, encoding_format="float")
    assert [d.index for d in as_base64.data] == [0, 1, 2, 3]
    for b64, flt in zip(as_base64.data, as_float.data, strict=True):
        assert len(b64.embedding) == HIDDEN and b64.embedding == flt.embedding
        assert abs(np.linalg.norm(b64.embedding) - 1) < 1e-5
    assert as_base64.usage.prompt_tokens == as_base64.usage.total_tokens > len(SENTENCES)


def test_similar_sentences_are_closer_than_unrelated_ones(client):
    cat, kitten, market, investors = (np.array(d.embedding) for d in
                                      client.embeddings.create(model="default", input=SENTENCES).data)
    # Measured in fp32 with mean pooling: 0.91 / 0.95 for the pairs, 0.71-0.75 across topics (the
    # stack serves the Q4_1 codes: the margins below hold there too).
    assert cos(cat, kitten) > cos(cat, market) + 0.05
    assert cos(market, investors) > cos(market, kitten) + 0.05
    assert cos(cat, cat) == pytest.approx(1.0)


def test_an_input_alone_equals_it_inside_a_list_and_dimensions_truncate(client):
    listed = client.embeddings.create(model="default", input=SENTENCES).data[2].embedding
    alone = client.embeddings.create(model="default", input=SENTENCES[2]).data[0].embedding
    np.testing.assert_allclose(alone, listed, rtol=0, atol=1e-5)  # batched with others or not
    short = client.embeddings.create(model="default", input=SENTENCES[2], dimensions=64).data[0].embedding
    head = np.array(alone[:64])
    np.testing.assert_allclose(short, head / np.linalg.norm(head), rtol=0, atol=1e-5)


def test_token_id_inputs_equal_their_text(client, stack):
    import httpx

    tokens = httpx.post(stack.http_url + "/tokenize", json={"prompt": SENTENCES[0]}).json()["tokens"]
    by_ids = client.embeddings.create(model="default", input=[tokens]).data[0].embedding
    by_text = client.embeddings.create(model="default", input=SENTENCES[0]).data[0].embedding
    np.testing.assert_allclose(by_ids, by_text, rtol=0, atol=1e-6)


def test_bad_inputs_are_400s_naming_the_field(client):
    for kwargs, param in [({"input": ""}, "input"), ({"input": ["ok", ""]}, "input[1]"),
                          ({"input": [[1, 2, 99999]]}, "input[0][2]"), ({"input": "hi", "dimensions": 577}, "dimensions")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model="default", **kwargs)
        assert info.value.status_code == 400 and info.value.param == param, kwargs


def test_native_grpc_returns_result_tensors(stack, client):
    expected = client.embeddings.create(model="default", input=SENTENCES[1]).data[0].embedding
    start = pb.PreprocessInput(text=SENTENCES[1], output_modalities=[pb.MODALITY_EMBEDDING],
                               model_kwargs=pb.ModelKwargs(embedding=pb.EmbeddingParams(dimensions=HIDDEN)))
    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = api_grpc.InferenceServiceStub(channel)
        events = list(stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=120))
        unary = stub.Generate(api.GenerateRequest(input=start), timeout=120)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "accepted" and kinds[-1] == "complete" and kinds.count("tensors") == 1
    (result,) = [e.tensors for e in events if e.HasField("tensors")]
    assert result.modality == pb.MODALITY_EMBEDDING and result.tensor.dtype == pb.D_TYPE_FLOAT32
    assert list(result.tensor.shape) == [HIDDEN]
    np.testing.assert_allclose(np.frombuffer(result.tensor.data, "<f4"), expected, rtol=0, atol=1e-5)
    done = events[-1].complete
    assert done.usage.completion_tokens == 0 and done.usage.prompt_tokens > 0
    assert [(c.modality, c.chunks) for c in done.output_chunk_counts] == [(pb.MODALITY_EMBEDDING, 1)]
    assert len(unary.tensors) == 1 and unary.tensors[0].tensor.data == result.tensor.data and not unary.text
