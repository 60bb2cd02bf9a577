"""POST /v1/embeddings on the real request runner, tokenizer and vocabulary of the default model,
in front of the echo engine (surface_harness.py: an embedding is the unit vector along axis
len(prompt) % width), so the body rules, fan-out order, encodings and usage are checked exactly."""

import base64
import json
import struct

import pytest
from surface_harness import ECHO_WIDTH, EchoBackend, collect, echo_embedding, http, make_runner

from services.common.errors import Code, MstarError
from services.preprocess.surfaces.http import dumps
from services.preprocess.surfaces.openai import embeddings
from services.preprocess.surfaces.openai.embeddings import MAX_INPUTS, WINDOW, create_embedding


def reply(body, runner):
    (frame,) = collect(create_embedding, http(body), runner)
    return json.loads(frame.data)


def error(body, runner) -> MstarError:
    with pytest.raises(MstarError) as info:
        collect(create_embedding, http(body), runner)
    return info.value


def floats(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def test_a_list_of_texts_is_one_embedding_per_input_in_order(runner, model):
    texts = ["hello", "the cat sat on the mat", "a"]
    out = reply({"model": "default", "input": texts}, runner)
    ids = [model.tokenizer.encode(t) for t in texts]
    assert out["object"] == "list" and out["model"] == "default"
    assert [d["index"] for d in out["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in out["data"])
    for d, prompt in zip(out["data"], ids, strict=True):
        assert d["embedding"] == floats(echo_embedding(prompt, ECHO_WIDTH))
    used = sum(len(i) for i in ids)
    assert out["usage"] == {"prompt_tokens": used, "total_tokens": used}


def test_base64_is_the_float32_bytes_and_token_inputs_run_as_given(runner):
    out = reply({"input": [[5, 6, 7], [9]], "encoding_format": "base64", "dimensions": 4}, runner)
    assert [base64.b64decode(d["embedding"]) for d in out["data"]] == [
        echo_embedding([5, 6, 7], 4), echo_embedding([9], 4)]
    flat = reply({"input": [5, 6, 7, 8, 9]}, runner)
    assert len(flat["data"]) == 1 and flat["usage"]["prompt_tokens"] == 5
    assert flat["data"][0]["embedding"] == floats(echo_embedding([5, 6, 7, 8, 9], ECHO_WIDTH))
    assert reply({"input": "hi"}, runner)["model"] == runner.model.name


@pytest.mark.parametrize(("body", "field", "reason"), [
    ({"input": ""}, "input", "INVALID_FIELD"),
    ({"input": []}, "input", "INVALID_FIELD"),
    ({"input": ["ok", ""]}, "input[1]", "INVALID_FIELD"),
    ({"input": [[1, 2], []]}, "input[1]", "INVALID_FIELD"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, "input", "INVALID_FIELD"),
    ({"input": [[1, 2], [3, 49152]]}, "input[1][1]", "TOKEN_OUT_OF_VOCAB"),
    ({"input": [1, 2, 99999]}, "input[2]", "TOKEN_OUT_OF_VOCAB"),
    ({"input": [[-1]]}, "input[0][0]", "INVALID_FIELD"),
    ({"input": "hi", "dimensions": 0}, "dimensions", "INVALID_FIELD"),
    ({"input": "hi", "dimensions": 577}, "dimensions", "INVALID_FIELD"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "INVALID_FIELD"),
    ({"input": "hi", "extra": 1}, "extra", "UNKNOWN_FIELD"),
    ({"input": [1] * 8193}, "input", "PROMPT_TOO_LONG"),
    ({"input": ["ok", "word " * 9000]}, "input[1]", "PROMPT_TOO_LONG"),
    ({"input": "hi", "model": "gpt-4"}, None, "MODEL_NOT_FOUND"),
    ({"input": ["a", [1, 2]]}, "input", "INVALID_FIELD"),
    ({"input": 5}, "input", "INVALID_FIELD"),
    ({"input": [True]}, "input[0]", "INVALID_FIELD"),
    ({"input": [[1, 2.5]]}, "input[0][1]", "INVALID_FIELD"),
])
def test_bad_inputs_are_400s_naming_the_field(runner, body, field, reason):
    err = error(body, runner)
    assert err.reason == reason
    if field is None:
        assert err.code == Code.NOT_FOUND
    else:
        assert err.code == Code.INVALID_ARGUMENT and err.metadata.get("field") == field, err.message


def test_a_whole_context_of_tokens_is_accepted(runner, model):
    # A generation request must leave room for one output token; an embedding fills the context.
    out = reply({"input": [7] * model.context_length}, runner)
    assert out["usage"]["prompt_tokens"] == model.context_length


def test_a_long_list_runs_at_most_a_window_at_once_and_frees_its_admission(model):
    backend = EchoBackend(step_s=0.005)
    runner = make_runner(model, backend)
    n = 3 * WINDOW + 5
    out = reply({"input": [[5] * (i + 1) for i in range(n)]}, runner)
    assert [d["embedding"] for d in out["data"]] == [floats(echo_embedding([5] * (i + 1), ECHO_WIDTH))
                                                     for i in range(n)]
    assert 1 < backend.most_in_flight <= WINDOW
    assert runner.num_running == 0 and runner.deps.admission.snapshot()["requests"] == 0


def test_the_first_failure_ends_the_call_and_cancels_the_rest(model):
    backend = EchoBackend(step_s=0.01)
    backend.fail_embedding_of_len = 3
    runner = make_runner(model, backend)
    err = error({"input": [[5] * (i + 1) for i in range(40)]}, runner)
    assert err.code == Code.UNAVAILABLE
    assert runner.num_running == 0 and runner.deps.admission.snapshot()["requests"] == 0
    assert len(backend.started) < 40  # the ones not started yet never were


def test_schema_is_published(runner):
    assert "embeddings" in embeddings.__name__
    assert dumps(embeddings.EmbeddingBody.model_json_schema())  # docs/schemas/embeddings.json


def test_native_embedding_requests_read_output_modalities(runner):
    from mstar.v1 import messages_pb2 as pb

    from services.preprocess import wire
    from services.preprocess.request import EmbeddingSpec

    def spec(surface="GenerateStream", **kwargs):
        return wire.request_spec(pb.PreprocessInput(text="hi", **kwargs), surface)

    assert spec().embedding is None
    assert spec(output_modalities=[pb.MODALITY_EMBEDDING]).embedding == EmbeddingSpec(None)
    dims = pb.ModelKwargs(embedding=pb.EmbeddingParams(dimensions=8))
    assert spec(output_modalities=[pb.MODALITY_EMBEDDING], model_kwargs=dims).embedding == EmbeddingSpec(8)
    for kwargs, field in [
        ({"output_modalities": [pb.MODALITY_EMBEDDING, pb.MODALITY_TEXT]}, "start.output_modalities"),
        ({"output_modalities": [pb.MODALITY_EMBEDDING],
          "model_kwargs": pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=3))}, "start.model_kwargs.sampling"),
    ]:
        with pytest.raises(MstarError) as info:
            spec("Session", **kwargs)
        assert info.value.metadata["field"] == field
    too_wide = pb.ModelKwargs(embedding=pb.EmbeddingParams(dimensions=577))
    request = spec("Session", output_modalities=[pb.MODALITY_EMBEDDING], model_kwargs=too_wide)
    with pytest.raises(MstarError) as info:
        collect_native(request, runner)
    assert info.value.metadata["field"] == "start.model_kwargs.embedding.dimensions"
    events = collect_native(spec(output_modalities=[pb.MODALITY_EMBEDDING], model_kwargs=dims), runner)
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "Accepted" and kinds[-1] == "Complete" and kinds.count("Tensor") == 1
    tensor = next(e for e in events if type(e).__name__ == "Tensor")
    assert tensor.shape == (8,) and events[-1].tensors == 1 and events[-1].completion_tokens == 0
    assert [(c.modality, c.chunks) for c in wire.complete(events[-1]).output_chunk_counts] == [
        (pb.MODALITY_EMBEDDING, 1)]


def collect_native(spec, runner):
    import asyncio

    async def go():
        scope = runner.scope()
        try:
            return [event async for event in scope.run(spec)]
        finally:
            scope.close()

    return asyncio.run(go())
