"""Against the REAL generation service with the default model (loopback subprocess)."""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import LoopThread, Preprocess, start_generation
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb


@pytest.fixture(scope="module")
def real_stack(model):
    # The exact HF oracle: these tests assert what the fp32 model answers ("Paris"). The default
    # numerics (the GGUF's Q4_1 codes, int8-quantized activations as llama.cpp) answer this prompt
    # differently: "L'Étoile, la Marseillaise, ..." (teacher-forced top-1 agreement 95 %,
    # tests/unit/generation/test_quantized.py).
    proc, port = start_generation("--model", "default", "--dtype", "float32", "--quantization", "none")
    loop = LoopThread()
    pre = Preprocess(loop, model, f"127.0.0.1:{port}")
    try:
        pre.wait_healthy(180)
        yield pre
    finally:
        pre.close()
        proc.terminate()
        proc.wait(30)
        loop.stop()


def _greedy(**kw):
    return pb.ModelKwargs(sampling=pb.SamplingParams(temperature=0, **kw))


def test_chat_stream_equals_unary(real_stack):
    inp = pb.PreprocessInput(
        messages=[pb.ChatMessage(role="user", content="What is the capital of France?")],
        model_kwargs=_greedy(max_tokens=24),
    )
    unary = real_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=120)
    events = list(real_stack.stub.GenerateStream(api.GenerateStreamRequest(input=inp), timeout=120))
    streamed = "".join(e.chunk.text for e in events if e.HasField("chunk"))
    assert streamed == unary.text
    assert "Paris" in unary.text
    assert events[-1].complete.finish_reason == pb.FINISH_REASON_STOP  # <|im_end|>


def test_streamed_chat_input_equals_whole(real_stack):
    question = "What is the capital of France? Answer in one short sentence, please."
    whole = real_stack.stub.Generate(
        api.GenerateRequest(
            input=pb.PreprocessInput(
                messages=[pb.ChatMessage(role="user", content=question)], model_kwargs=_greedy(max_tokens=16)
            )
        ),
        timeout=120,
    )
    rid = f"chat-stream-{time.time_ns()}"
    start = pb.PreprocessInput(
        request_id=rid,
        messages=[pb.ChatMessage(role="user", content="")],
        input_modalities=[pb.MODALITY_TEXT],
        model_kwargs=_greedy(max_tokens=16),
    )
    call = real_stack.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=120)
    events = iter(call)
    assert next(events).HasField("accepted")
    pieces = [question[i * len(question) // 8 : (i + 1) * len(question) // 8] for i in range(8)]
    for i, piece in enumerate(pieces):
        real_stack.stub.Append(
            api.AppendRequest(
                append=pb.ClientAppend(request_id=rid, text=piece, ends=[pb.MODALITY_TEXT] if i == 7 else [])
            ),
            timeout=30,
        )
    rest = list(events)
    assert rest[-1].complete.usage.prompt_tokens == whole.complete.usage.prompt_tokens
    assert "".join(e.chunk.text for e in rest if e.HasField("chunk")) == whole.text


def test_stop_string_on_real_output(real_stack):
    inp = pb.PreprocessInput(
        messages=[pb.ChatMessage(role="user", content="What is the capital of France?")],
        model_kwargs=_greedy(max_tokens=24, stop=["Paris"], include_stop_str_in_output=True),
    )
    reply = real_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=120)
    assert reply.text.endswith("Paris") and reply.text.count("Paris") == 1
    assert reply.complete.stop_reason == "Paris"


def test_deadline_aborts_real_generation(real_stack):
    inp = pb.PreprocessInput(
        text="Count to one thousand:", model_kwargs=_greedy(max_tokens=2000, ignore_eos=True)
    )
    with pytest.raises(grpc.RpcError) as info:
        real_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=1.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Bounded (nothing hangs), generous for a loaded 2-core box: the abort lands within a step.
    end = time.monotonic() + 15
    while real_stack.backend.num_requests or real_stack.servicer.num_running:
        assert time.monotonic() < end
        time.sleep(0.02)


def test_native_structured_output_field(real_stack):
    """SamplingParams.structured_output on the native API: the output is one of the choices; a
    schema that does not compile is INVALID_ARGUMENT naming the field where the client set it."""
    ask = [pb.ChatMessage(role="user", content="Is the sky blue?")]
    constraint = pb.StructuredOutput(choice=pb.Choices(choices=["yes", "no"]))
    kwargs = pb.ModelKwargs(sampling=pb.SamplingParams(temperature=1.0, seed=3, max_tokens=8,
                                                       structured_output=constraint))
    reply = real_stack.stub.Generate(api.GenerateRequest(input=pb.PreprocessInput(messages=ask, model_kwargs=kwargs)),
                                     timeout=120)
    assert reply.text in ("yes", "no")
    bad = pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=8, structured_output=pb.StructuredOutput(
        json_schema='{"type": "strin"}')))
    with pytest.raises(grpc.RpcError) as info:
        real_stack.stub.Generate(api.GenerateRequest(input=pb.PreprocessInput(messages=ask, model_kwargs=bad)),
                                 timeout=120)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("input.model_kwargs.sampling.structured_output.json_schema: does not compile")
