"""A request's event queue on the shared backend stream is bounded: a reader that falls behind is
failed with SLOW_CONSUMER (and aborted in the engine), but a reader that is merely behind when its
request finishes still gets every token, then the finish."""

from services.common.errors import Code
from services.preprocess.backend import (
    BackendFailed,
    BackendFinished,
    BackendRequest,
    GenerationBackend,
    TokenStep,
)


def backend_with_request(queue_size: int):
    backend = GenerationBackend("127.0.0.1:1", queue_size=queue_size)  # never started: no network
    sent = []
    backend._send = sent.append  # what would go to the engine on the stream
    request = BackendRequest(backend, "r#0", queue_size)
    backend._requests["r#0"] = request
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
    request.deliver(BackendFinished("length", completion_tokens=4))
    assert drain(request) == [TokenStep(0), TokenStep(1), TokenStep(2), TokenStep(3),
                              BackendFinished("length", completion_tokens=4)]
    assert request.ended and not sent  # finished normally: nothing to abort


def test_a_reader_over_the_bound_is_failed_slow_consumer_and_aborted_in_the_engine():
    backend, request, sent = backend_with_request(queue_size=4)
    for i in range(5):
        request.deliver(TokenStep(i))
    events = drain(request)
    assert len(events) == 1 and isinstance(events[0], BackendFailed)
    assert events[0].error.code == Code.RESOURCE_EXHAUSTED and events[0].error.reason == "SLOW_CONSUMER"
    assert request.ended and "r#0" not in backend._requests
    assert [e.abort.request_id for e in sent] == ["r#0"]
    request.deliver(TokenStep(9))  # the engine's late tokens and finish are dropped after the end
    request.deliver(BackendFinished("length"))
    assert request.queue.empty()
