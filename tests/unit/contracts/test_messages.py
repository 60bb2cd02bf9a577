"""The contract: every vocabulary message exists and survives a wire round trip; the internal
stream's frames are typed by direction."""

import struct

import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.v1 import inference_service_pb2 as inf_pb2
from mstar.v1 import messages_pb2 as pb

SHARED = ["PreprocessInput", "ClientAppend", "ResultChunk", "ResultTensors", "RequestComplete", "RequestFailed",
          "DataWorkerProfile"]
INTERNAL = ["ClientFrame", "ServerFrame", "Abort", "ResultTokens", "ConductorStatus"]


@pytest.mark.parametrize("name", SHARED)
def test_shared_vocabulary_message_exists(name):
    assert name in pb.DESCRIPTOR.message_types_by_name


@pytest.mark.parametrize("name", INTERNAL)
def test_internal_message_lives_in_the_internal_package_only(name):
    assert name in gen_pb2.DESCRIPTOR.message_types_by_name
    assert name not in pb.DESCRIPTOR.message_types_by_name


def _carried(message) -> set[str]:
    oneof = message.DESCRIPTOR.oneofs_by_name["frame"]
    return {f.message_type.full_name for f in oneof.fields}


def test_frames_are_typed_by_direction():
    # Issue 13: a wrong-direction message must not be expressible on the internal stream.
    assert _carried(gen_pb2.ClientFrame) == {
        "mstar.v1.PreprocessInput", "mstar.v1.ClientAppend", "mstar.generation.v1.Abort"}
    assert _carried(gen_pb2.ServerFrame) == {
        "mstar.generation.v1.ResultTokens", "mstar.v1.RequestComplete", "mstar.v1.RequestFailed",
        "mstar.v1.ResultTensors", "mstar.generation.v1.ConductorStatus"}


def _roundtrip(msg):
    again = type(msg).FromString(msg.SerializeToString())
    assert again == msg
    return again


def test_preprocess_input_roundtrip():
    msg = pb.PreprocessInput(
        request_id="r1",
        client_request_id="c1",
        text="Hello",
        messages=[pb.ChatMessage(role="user", content="hi")],
        prompt_parts=[pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=[1, 2, 3]))],
        input_modalities=[pb.MODALITY_TEXT],
        output_modalities=[pb.MODALITY_TEXT],
        ends=[pb.MODALITY_TEXT],
    )
    msg.model_kwargs.sampling.temperature = 0.0
    msg.model_kwargs.sampling.stop.extend(["\n\n", "END"])
    msg.model_kwargs.extra.update({"custom": 1})
    again = _roundtrip(msg)
    # `optional` keeps presence: an explicit 0 temperature is not "unset".
    assert again.model_kwargs.sampling.HasField("temperature")
    assert not again.model_kwargs.sampling.HasField("top_p")


def test_client_append_roundtrip():
    _roundtrip(
        pb.ClientAppend(
            request_id="r1",
            text="more",
            chunks=[pb.PromptPart(modality=pb.MODALITY_IMAGE, data=b"\x89PNG", mime_type="image/png")],
            ends=[pb.MODALITY_TEXT, pb.MODALITY_IMAGE],
        )
    )


def test_result_tokens_frame_carries_many_requests():
    frame = gen_pb2.ResultTokens(
        step=42,
        request_ids=["a", "b", "c"],
        token_ids=[11, 22, 33],
        loop_indices=[0, 5, 9],
        signal=gen_pb2.SIGNAL_STEP,
        modality=pb.MODALITY_TOKENS,
        metadata={"batch_tokens": "3"},
        logprobs=[pb.TokenLogprobs(logprob=-0.1, top_token_ids=[11], top_logprobs=[-0.1]),
                  pb.TokenLogprobs(), pb.TokenLogprobs()],
    )
    again = _roundtrip(frame)
    rows = list(zip(again.request_ids, again.token_ids, again.loop_indices, strict=True))
    assert rows == [("a", 11, 0), ("b", 22, 5), ("c", 33, 9)]


def test_result_tensors_payload_is_little_endian_row_major():
    values = [1.0, -2.5, 3.25, 0.0, 7.0, 8.5]
    tensor = pb.Tensor(dtype=pb.D_TYPE_FLOAT32, shape=[2, 3], data=struct.pack("<6f", *values))
    msg = pb.ResultTensors(
        request_id="r",
        modality=pb.MODALITY_TOKENS,
        tensor=tensor,
        edge=pb.GraphEdge(from_node="decoder", to_node="lm_head"),
        loop_indices=[pb.LoopIndex(loop="decode", index=3)],
    )
    again = _roundtrip(msg)
    assert list(struct.unpack("<6f", again.tensor.data)) == values
    assert list(again.tensor.shape) == [2, 3]


def test_terminal_and_status_messages_roundtrip():
    now = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5)
    _roundtrip(
        pb.RequestComplete(
            request_id="r",
            output_chunk_counts=[pb.ModalityCount(modality=pb.MODALITY_TEXT, chunks=7)],
            conductor_arrival_time=now,
            conductor_ingest_time=now,
            conductor_finish_time=now,
            node_timings=[pb.NodeTiming(node="prefill", duration_ms=1.5)],
            rx=pb.TransferInfo(messages=1, bytes=100),
            tx=pb.TransferInfo(messages=8, bytes=400),
            usage=pb.Usage(prompt_tokens=10, cached_prompt_tokens=4, completion_tokens=7, total_tokens=17),
            timings=pb.Timings(queue_ms=1, prefill_ms=2, time_to_first_token_ms=3, decode_ms=4, e2e_ms=10),
            finish_reason=pb.FINISH_REASON_STOP,
            stop_reason="\n\n",
        )
    )
    _roundtrip(pb.RequestFailed(request_id="r", message="too long", code=3, http_status=400, reason="PROMPT_TOO_LONG",
                                client_request_id="mine"))
    _roundtrip(
        gen_pb2.ConductorStatus(
            time=now,
            metrics=[gen_pb2.MetricSnapshot(family="mstar_generation", name="kv_blocks_used",
                                            kind=gen_pb2.METRIC_KIND_GAUGE, value=12)],
        )
    )
    _roundtrip(
        pb.DataWorkerProfile(request_id="r", dequeue_time=now, preprocess_finish_time=now,
                             input_infos=[pb.InputInfo(modality=pb.MODALITY_TEXT, size_bytes=5, num_tokens=2)],
                             modalities=[pb.MODALITY_TEXT], upload_sizes_bytes=[5], failed=False)
    )


def test_a_stream_response_holds_several_frames():
    resp = gen_pb2.StreamResponse(
        frames=[
            gen_pb2.ServerFrame(result_tokens=gen_pb2.ResultTokens(step=1, request_ids=["a"], token_ids=[5],
                                                                   loop_indices=[0])),
            gen_pb2.ServerFrame(request_complete=pb.RequestComplete(request_id="a")),
        ]
    )
    again = _roundtrip(resp)
    assert [f.WhichOneof("frame") for f in again.frames] == ["result_tokens", "request_complete"]


def test_public_rpcs_have_their_own_messages():
    service = inf_pb2.DESCRIPTOR.services_by_name["InferenceService"]
    methods = {m.name: m for m in service.methods}
    assert {"Generate", "GenerateStream", "Session", "Append", "Cancel", "ListModels"} <= set(methods)
    assert methods["Session"].client_streaming and methods["Session"].server_streaming
    assert methods["GenerateStream"].server_streaming and not methods["GenerateStream"].client_streaming
    stream = gen_pb2.DESCRIPTOR.services_by_name["GenerationService"].methods_by_name["Stream"]
    assert stream.client_streaming and stream.server_streaming
    proto = descriptor_pb2.FileDescriptorProto()
    inf_pb2.DESCRIPTOR.CopyToProto(proto)
    assert proto.package == "mstar.v1"
    gen_pb2.DESCRIPTOR.CopyToProto(proto)
    assert proto.package == "mstar.generation.v1"
