"""The documented maximum of `POST /v1/embeddings` (2,048 inputs) on the real default model
through real Envoy: its JSON body is ~25 MB, past the 16 MiB a gRPC message may carry, which was a
retryable 429 after the whole batch had run (issue 28); it is sent in pieces now. One-token inputs
keep the compute small (2,048 prefill-only requests, 16 at a time; docs/http.md "Embeddings" has
the times measured); the size of the body depends only on the number of inputs and the width."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from services.preprocess.surfaces.openai.embeddings import MAX_INPUTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HIDDEN = 576  # SmolLM2-135M's hidden size
GRPC_MESSAGE_CAP = 16 * 1024 * 1024


def test_the_documented_most_embeddings_succeed_as_one_body(stack):
    inputs = [[1000 + i] for i in range(MAX_INPUTS)]
    reply = httpx.post(stack.http_url + "/v1/embeddings", json={"input": inputs}, timeout=600)
    assert reply.status_code == 200, reply.text[:300]
    assert len(reply.content) > GRPC_MESSAGE_CAP  # would not fit one gRPC message
    body = reply.json()
    assert [d["index"] for d in body["data"]] == list(range(MAX_INPUTS))
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (MAX_INPUTS, HIDDEN)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert len({tuple(v[:8]) for v in vectors}) > MAX_INPUTS // 2  # different tokens, different vectors
