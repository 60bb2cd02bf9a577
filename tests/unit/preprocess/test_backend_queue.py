"""A request's event queue on the shared backend stream is bounded: a reader that falls behind is
failed with SLOW_CONSUMER (and aborted in the engine), but a reader that is merely behind when its
request finishes still gets every token, then the finish."""

from mstar.v1 import messages_pb2 as pb

from services.common.errors import Code
from services.common.finish import FinishReason
from services.preprocess.backend import GenerationBackend
from services.preprocess.backend_events import BackendFailed, BackendFinished, TokenStep
from services.preprocess.backend_request import BackendRequest


def backend_with_request(queue_size: int):
    backend = GenerationBackend("127.0.0.1:1", queue_size=queue_size)  # never started: no network
    sent = []
    backend.send = sent.append  # what would go to the engine on the stream
    request = BackendRequest("r", [1, 2], pb.ModelKwargs(), input_open=False, queue_size=queue_size)
    request.backend, request.key = backend, "r0"
    backend._requests["r0"] = request
    return backend, request, sent


def drain(request: BackendRequest) -> list:
    events = []
    while not request.queue.empty():
        events.append(request.queue.get_nowait())
    return events


def test_a_reader_behind_at_the_finish_still_gets_every_token_then_the_finish():
    _, request, sent = backend_with_request(queue_size=4)
    for i in range(4):
        request.deliver(TokenStep(i))
    request.deliver(BackendFinished(FinishReason.LENGTH, completion_tokens=4))
    assert drain(request) == [TokenStep(0), TokenStep(1), TokenStep(2), TokenStep(3),
                              BackendFinished(FinishReason.LENGTH, completion_tokens=4)]
    assert request.ended and not sent  # finished normally: nothing to abort


def test_a_reader_over_the_bound_is_failed_slow_consumer_and_aborted_in_the_engine():
    backend, request, sent = backend_with_request(queue_size=4)
    for i in range(5):
        request.deliver(TokenStep(i))
    events = drain(request)
    assert len(events) == 1 and isinstance(events[0], BackendFailed)
    assert events[0].error.code == Code.RESOURCE_EXHAUSTED and events[0].error.reason == "SLOW_CONSUMER"
    assert request.ended and "r0" not in backend._requests
    assert [e.abort.request_id for e in sent] == ["r0"]
    request.deliver(TokenStep(9))  # the engine's late tokens and finish are dropped after the end
    request.deliver(BackendFinished(FinishReason.LENGTH))
    assert request.queue.empty()


def test_a_request_failed_with_an_unset_code_is_internal_never_ok():
    # Issue 13, finding 7: code 0 became Code.OK, which the HTTP surfaces showed as 200.
    from mstar.generation.v1 import generation_service_pb2 as gen_pb2
    from mstar.v1 import messages_pb2 as pb

    backend, request, _ = backend_with_request(queue_size=4)
    failed = pb.RequestFailed(request_id="r0", message="lost its code")
    backend._dispatch(gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame(request_failed=failed)]))
    (event,) = drain(request)
    assert event.error.code == Code.INTERNAL and event.error.http_status == 500


def test_internal_keys_stay_short_whatever_id_the_client_chose():
    # Issue 13, finding 1: every engine-step frame repeats the key of every running row.
    from mstar.generation.v1 import generation_service_pb2 as gen_pb2

    backend = GenerationBackend("127.0.0.1:1")
    sent = []
    backend._healthy, backend._outbox = True, object()  # pretend connected; capture frames instead
    backend.send = sent.append
    from services.preprocess.request import Sampling
    from services.preprocess.wire import engine_kwargs

    request = BackendRequest("c" * 128, [1, 2], engine_kwargs(Sampling(), 4), input_open=False, queue_size=4)
    backend.attach(request)
    (frame,) = sent
    assert isinstance(frame, gen_pb2.ClientFrame)
    assert len(request.key) <= 12 and frame.preprocess_input.request_id == request.key
    assert frame.preprocess_input.client_request_id == "c" * 128  # the public id, for the logs


def test_a_burst_is_sent_in_bounded_messages():
    # A burst of requests must never build one StreamRequest near the 16 MB limit: that would
    # break the stream every request shares.
    import asyncio

    from mstar.generation.v1 import generation_service_pb2 as gen_pb2
    from mstar.v1 import messages_pb2 as pb

    from services.preprocess.backend import _frames

    async def scenario():
        outbox: asyncio.Queue = asyncio.Queue()
        big = pb.PreprocessInput(request_id="k", prompt_parts=[pb.PromptPart(token_ids=pb.TokenIds(ids=[7] * 100_000))])
        for _ in range(60):  # 60 x ~200 KB
            outbox.put_nowait(gen_pb2.ClientFrame(preprocess_input=big))
        for _ in range(5000):
            outbox.put_nowait(gen_pb2.ClientFrame(abort=gen_pb2.Abort(request_id="k")))
        outbox.put_nowait(None)
        # Sizes only: asyncio.run's teardown reprs the task result, and a repr of 12 MB of
        # messages takes seconds.
        return [(len(m.frames), m.ByteSize()) async for m in _frames(outbox)]

    sizes = asyncio.run(scenario())
    assert sum(n for n, _ in sizes) == 5060
    assert all(n <= 1024 and size < 2 * 1024 * 1024 for n, size in sizes), sizes


def test_an_embedding_request_starts_as_one_and_its_vector_counts_as_output():
    from mstar.generation.v1 import generation_service_pb2 as gen_pb2

    from services.preprocess.backend_events import TensorResult
    from services.preprocess.request import EmbeddingSpec
    from services.preprocess.wire import embedding_kwargs

    backend = GenerationBackend("127.0.0.1:1", queue_size=4)
    backend._healthy, sent = True, []
    backend._outbox, backend.send = object(), sent.append
    request = BackendRequest("e", [1, 2], embedding_kwargs(EmbeddingSpec(8)), input_open=False, queue_size=4)
    backend.attach(request)
    (start,) = [f.preprocess_input for f in sent]
    assert list(start.output_modalities) == [pb.MODALITY_EMBEDDING]
    assert start.model_kwargs.embedding.dimensions == 8 and not start.model_kwargs.HasField("sampling")
    tensor = pb.ResultTensors(request_id=request.key, modality=pb.MODALITY_EMBEDDING,
                              tensor=pb.Tensor(dtype=pb.D_TYPE_FLOAT32, shape=[2], data=b"\0" * 8))
    backend._dispatch(gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame(result_tensors=tensor)]))
    assert drain(request) == [TensorResult(b"\0" * 8, (2,))]
    # Output came back: a broken stream now fails it instead of running it again elsewhere.
    assert request.tokens_received
