"""InferenceService behaviour over real gRPC, in front of the contract fake (fast)."""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import Preprocess
from fake_generation import start_fake
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb


def _input(text="Hello world, how are you today?", **sampling):
    return pb.PreprocessInput(text=text, model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(**sampling)))


def _details(err: grpc.RpcError):
    status = rpc_status.from_call(err)
    out = {}
    for d in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            if d.Is(cls.DESCRIPTOR):
                msg = cls()
                d.Unpack(msg)
                out[cls.__name__] = msg
    return out


def test_stream_equals_unary(fake_stack):
    inp = _input(max_tokens=7)
    unary = fake_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=10)
    events = list(fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=inp), timeout=10))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "accepted" and kinds[-1] == "complete" and "profile" in kinds
    streamed = "".join(e.chunk.text for e in events if e.HasField("chunk"))
    assert streamed == unary.text == "Hello world, how are you today"
    assert unary.complete.usage.completion_tokens == 7
    assert unary.complete.finish_reason == pb.FINISH_REASON_LENGTH


def test_stop_string_not_leaked(fake_stack):
    inp = _input("one two three four", max_tokens=4, stop=[" three"])
    events = list(fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=inp), timeout=10))
    text = "".join(e.chunk.text for e in events if e.HasField("chunk"))
    done = events[-1].complete
    assert text == "one two"
    assert (done.finish_reason, done.stop_reason) == (pb.FINISH_REASON_STOP, " three")
    # The engine never saw the stop string, yet the finish carries its real usage and timings
    # (they used to be all 0): the request is stopped and its engine-side end awaited.
    assert done.usage.cached_prompt_tokens == 2 and done.usage.completion_tokens == 3
    assert done.timings.time_to_first_token_ms == 3.0 and done.timings.e2e_ms > 0


def test_chat_messages(fake_stack, model):
    inp = pb.PreprocessInput(
        messages=[pb.ChatMessage(role="user", content="hi")],
        model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=3)),
    )
    events = list(fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=inp), timeout=10))
    expected = len(
        model.tokenizer.encode(
            model.chat_template.render(
                [
                    __import__("services.preprocess.chat_template", fromlist=["ChatMessage"]).ChatMessage(
                        "user", "hi"
                    )
                ]
            )
        )
    )
    assert events[0].accepted.prompt_tokens == expected


@pytest.mark.parametrize(
    "sampling, field",
    [
        ({"temperature": -1.0}, "input.model_kwargs.sampling.temperature"),
        ({"top_p": float("nan")}, "input.model_kwargs.sampling.top_p"),
        ({"max_tokens": 0}, "input.model_kwargs.sampling.max_tokens"),
        ({"max_tokens": 10**9}, "input.model_kwargs.sampling.max_tokens"),
        ({"n": 1000}, "input.model_kwargs.sampling.n"),
        ({"logprobs": 1000}, "input.model_kwargs.sampling.logprobs"),
        ({"stop": ["x" * 10_000]}, "input.model_kwargs.sampling.stop[0]"),
        ({"stop": ["s"] * 10_000}, "input.model_kwargs.sampling.stop"),
    ],
)
def test_invalid_sampling_is_invalid_argument(fake_stack, sampling, field):
    with pytest.raises(grpc.RpcError) as info:
        list(fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=_input(**sampling)), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _details(info.value)["BadRequest"].field_violations[0].field == field


def test_prompt_too_long(fake_stack, model):
    text = "hello " * (model.context_length + 10)
    with pytest.raises(grpc.RpcError) as info:
        fake_stack.stub.Generate(api.GenerateRequest(input=_input(text)), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _details(info.value)["ErrorInfo"].reason == "PROMPT_TOO_LONG"


def test_max_tokens_clamped_with_warning(fake_stack, model):
    n = len(model.tokenizer.encode("hello " * 8000))
    events = fake_stack.stub.GenerateStream(
        api.GenerateStreamRequest(input=_input("hello " * 8000, max_tokens=8000)), timeout=20
    )
    first = next(iter(events))
    assert first.accepted.max_tokens == model.context_length - n
    assert first.accepted.warnings == [f"max_tokens clamped to {model.context_length - n}"]
    events.cancel()


def test_an_open_inputs_max_tokens_is_resolved_at_its_end_with_the_warning(fake_stack, model):
    """Preprocess resolves max_tokens once the prompt is complete: the last append carries the
    clamped value to the engine, and the client is told in the Complete's warnings."""
    start = pb.PreprocessInput(request_id="open-clamp", input_modalities=[pb.MODALITY_TEXT],
                               model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=8000)))
    events = fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=20)
    it = iter(events)
    assert next(it).accepted.max_tokens == 8000  # what fits an empty prompt so far
    text = "hello " * 8000
    fake_stack.stub.Append(api.AppendRequest(append=pb.ClientAppend(
        request_id="open-clamp", text=text, ends=[pb.MODALITY_TEXT])), timeout=10)
    room = model.context_length - len(model.tokenizer.encode(text))
    done = list(it)[-1].complete
    assert done.warnings == [f"max_tokens clamped to {room}"] and done.usage.completion_tokens == room


def test_unsupported_modality(fake_stack):
    inp = _input()
    inp.prompt_parts.add(modality=pb.MODALITY_IMAGE, data=b"\x89PNG")
    with pytest.raises(grpc.RpcError) as info:
        fake_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "image" in info.value.details()


def test_file_paths_disabled_by_default(fake_stack):
    inp = _input()
    inp.prompt_parts.add(modality=pb.MODALITY_TEXT, file_path="/etc/passwd")
    with pytest.raises(grpc.RpcError) as info:
        fake_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_append_in_chunks_then_generate(fake_stack, model):
    text = "The quick brown fox jumps over the lazy dog. " * 20
    pieces = [text[i * len(text) // 8 : (i + 1) * len(text) // 8] for i in range(8)]
    start = pb.PreprocessInput(
        request_id="streamed-1",
        input_modalities=[pb.MODALITY_TEXT],
        model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=5)),
    )
    events = fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=20)
    it = iter(events)
    assert next(it).HasField("accepted")
    for i, piece in enumerate(pieces):
        reply = fake_stack.stub.Append(
            api.AppendRequest(
                append=pb.ClientAppend(
                    request_id="streamed-1", text=piece, ends=[pb.MODALITY_TEXT] if i == 7 else []
                )
            ),
            timeout=10,
        )
        assert reply.input_ended == (i == 7)
    assert reply.prompt_tokens == len(model.tokenizer.encode(text))
    rest = list(it)
    assert rest[-1].complete.usage.prompt_tokens == len(model.tokenizer.encode(text))
    assert "".join(e.chunk.text for e in rest if e.HasField("chunk")) == model.tokenizer.decode(
        model.tokenizer.encode(text)[:5]
    )
    with pytest.raises(grpc.RpcError) as info:  # finished
        fake_stack.stub.Append(api.AppendRequest(append=pb.ClientAppend(request_id="streamed-1", text="x")))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_append_after_input_ended(fake_stack):
    start = pb.PreprocessInput(
        request_id="ended-1",
        text="a b c",
        input_modalities=[pb.MODALITY_TEXT],
        ends=[],
        model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=2000)),
    )
    events = fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=20)
    next(iter(events))
    fake_stack.stub.Append(
        api.AppendRequest(append=pb.ClientAppend(request_id="ended-1", ends=[pb.MODALITY_TEXT]))
    )
    with pytest.raises(grpc.RpcError) as info:
        fake_stack.stub.Append(api.AppendRequest(append=pb.ClientAppend(request_id="ended-1", text="more")))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert fake_stack.stub.Cancel(api.CancelRequest(request_id="ended-1")).cancelled
    assert list(events)[-1].complete.finish_reason == pb.FINISH_REASON_CANCELLED


def test_client_cancel_aborts_generation(fake_stack):
    call = fake_stack.stub.GenerateStream(
        api.GenerateStreamRequest(input=_input(max_tokens=5000)), timeout=20
    )
    it = iter(call)
    rid = next(it).accepted.request_id
    next(it)
    call.cancel()
    deadline = time.monotonic() + 5
    while rid not in fake_stack.fake.aborted:
        assert time.monotonic() < deadline, "abort never reached the generation service"
        time.sleep(0.01)
    assert fake_stack.servicer.num_running == 0


def test_a_cancel_that_overtakes_its_start_still_cancels_it(fake_stack):
    """A Cancel by id and the start it is about are two calls nothing orders (issue 28: in a storm
    some cancels came first, found nothing, and the request ran to its deadline). The cancel is
    remembered: the start that follows ends at once, cancelled; the next start under the id runs."""
    stub = fake_stack.stub
    assert not stub.Cancel(api.CancelRequest(request_id="early-1")).cancelled  # nothing runs yet
    start = _input(max_tokens=5000)
    start.request_id = "early-1"
    events = list(stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=10))
    assert events[0].accepted.request_id == "early-1"
    assert events[-1].complete.finish_reason == pb.FINISH_REASON_CANCELLED, events[-1]
    start.model_kwargs.sampling.max_tokens = 3
    again = stub.Generate(api.GenerateRequest(input=start), timeout=10)
    assert again.complete.finish_reason == pb.FINISH_REASON_LENGTH


def test_a_late_cancel_of_a_finished_request_spares_the_ids_next_use(fake_stack):
    start = _input(max_tokens=3)
    start.request_id = "done-1"
    assert fake_stack.stub.Generate(api.GenerateRequest(input=start), timeout=10).complete.usage.completion_tokens == 3
    assert not fake_stack.stub.Cancel(api.CancelRequest(request_id="done-1")).cancelled
    reused = fake_stack.stub.Generate(api.GenerateRequest(input=start), timeout=10)
    assert reused.complete.finish_reason == pb.FINISH_REASON_LENGTH and reused.complete.usage.completion_tokens == 3


def test_deadline_exceeded_aborts_generation(fake_stack):
    with pytest.raises(grpc.RpcError) as info:
        fake_stack.stub.Generate(api.GenerateRequest(input=_input(max_tokens=5000)), timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 5
    while fake_stack.fake.live or fake_stack.servicer.num_running:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_list_models(fake_stack, model):
    reply = fake_stack.stub.ListModels(api.ListModelsRequest())
    assert reply.data[0].id == model.name and reply.data[0].max_model_len == 8192


def test_open_input_that_goes_quiet_fails_and_frees_its_slot(loop, model):
    """A client that opens its input and never ends it cannot hold an admission slot forever."""
    server, _fake, port = loop.run(start_fake())
    pre = Preprocess(loop, model, f"127.0.0.1:{port}", keepalive_s=0.1, input_idle_s=0.5)
    try:
        pre.wait_healthy()
        start = pb.PreprocessInput(
            request_id="quiet-1", text="a b", input_modalities=[pb.MODALITY_TEXT],
            model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=5)),
        )
        events = list(pre.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=20))
        assert events[0].HasField("accepted")
        failed = events[-1].failed
        assert failed.reason == "INPUT_IDLE_TIMEOUT" and failed.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert pre.servicer.num_running == 0 and pre.backend.num_requests == 0
    finally:
        pre.close()
        loop.run(server.stop(None))


def test_preprocessing_time_is_observed_once_per_admitted_request(fake_stack):
    count = "mstar_preprocess_preprocess_seconds_count"
    before = fake_stack.servicer.metrics.registry.get_sample_value(count) or 0
    fake_stack.stub.Generate(api.GenerateRequest(input=_input(max_tokens=2)), timeout=10)
    with pytest.raises(grpc.RpcError):  # refused before admission: no preprocessing figure
        fake_stack.stub.Generate(api.GenerateRequest(input=_input(temperature=-1.0)), timeout=10)
    assert fake_stack.servicer.metrics.registry.get_sample_value(count) == before + 1


def test_appends_that_keep_an_input_alive_cannot_hold_it_open_past_the_lifetime_cap(loop, model):
    """Finding 3: an append every so often resets the idle timer, but the input still closes (and
    frees its admission and open-input slots) at the absolute lifetime cap."""
    server, _fake, port = loop.run(start_fake())
    pre = Preprocess(loop, model, f"127.0.0.1:{port}", keepalive_s=0.1, input_idle_s=0.5, input_lifetime_s=1.5)
    try:
        pre.wait_healthy()
        start = pb.PreprocessInput(
            request_id="squat-1", text="a", input_modalities=[pb.MODALITY_TEXT],
            model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=5)),
        )
        stream = pre.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=20)
        assert next(stream).HasField("accepted")
        t0 = time.monotonic()
        appended = 0
        while time.monotonic() - t0 < 2.5:  # every 0.3 s: never idle for 0.5 s
            try:
                pre.stub.Append(api.AppendRequest(append=pb.ClientAppend(request_id="squat-1", text=" b")), timeout=5)
                appended += 1
            except grpc.RpcError as err:
                assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
                break
            time.sleep(0.3)
        events = list(stream)
        failed = events[-1].failed
        assert failed.reason == "INPUT_OPEN_TOO_LONG" and failed.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert 1.5 <= time.monotonic() - t0 < 3.0 and appended >= 4
        assert pre.servicer.num_running == 0 and pre.backend.num_requests == 0
        admission = pre.servicer.runner.deps.admission
        assert admission.snapshot() == {"clients": 0, "busiest_client_requests": 0, "open_inputs": 0, "requests": 0}
        metrics = pre.servicer.metrics.registry
        assert metrics.get_sample_value("mstar_preprocess_requests_failed_total", {"reason": "INPUT_OPEN_TOO_LONG"}) == 1
        assert metrics.get_sample_value("mstar_preprocess_input_open_seconds_count") == 1
    finally:
        pre.close()
        loop.run(server.stop(None))
