"""A backlog of engine steps leaves the generation service as one StreamResponse: steps dispatched
while the writer has not taken the queued message join it, in step order, bounded; a message
queued after it (a status, an error) is never overtaken by later steps."""

from __future__ import annotations

from mstar.generation.v1 import generation_service_pb2 as gen_pb2

from services.common import errors
from services.common.serving import ServingState
from services.generation import outbox
from services.generation.outputs import StepOutput, TokenEvent, TokenLogprobs
from services.generation.servicer import GenerationServicer, _Stream


def _servicer() -> tuple[GenerationServicer, _Stream]:
    s = GenerationServicer(ServingState("generation"))
    stream = _Stream(7, active={"a", "b"})
    s._streams[stream.stream_id] = stream
    return s, stream


def _step(step: int, *request_ids: str) -> StepOutput:
    out = StepOutput(step=step)
    out.tokens = [TokenEvent((7, rid), token_id=100 + step, index=step) for rid in request_ids or ("a",)]
    return out


def _take(s: GenerationServicer, stream: _Stream) -> list:
    items = []
    while not stream.outbox.empty():
        items.append(stream.outbox.get_nowait())
    return items


def _steps(response: gen_pb2.StreamResponse) -> list[int]:
    return [f.result_tokens.step for f in response.frames]


def test_a_step_the_writer_takes_at_once_goes_out_alone():
    s, stream = _servicer()
    s._dispatch(_step(0))
    [first] = _take(s, stream)
    s._dispatch(_step(1))
    [second] = _take(s, stream)
    assert _steps(first) == [0] and _steps(second) == [1]
    assert stream.outbox.queued_frames == 0


def test_steps_queued_behind_a_waiting_message_join_it_in_order():
    s, stream = _servicer()
    for i in range(5):
        s._dispatch(_step(i, "a", "b"))
    [response] = _take(s, stream)
    assert _steps(response) == [0, 1, 2, 3, 4]
    tokens = response.frames[2].result_tokens
    assert list(tokens.request_ids) == ["a", "b"] and list(tokens.token_ids) == [102, 102]
    assert list(tokens.loop_indices) == [2, 2] and tokens.metadata["batch_tokens"] == "0"
    assert tokens.signal == gen_pb2.SIGNAL_STEP


def test_a_message_queued_after_the_open_one_closes_it():
    s, stream = _servicer()
    s._dispatch(_step(0))
    stream.outbox.put(gen_pb2.StreamResponse(frames=[gen_pb2.ServerFrame()]))  # e.g. a ConductorStatus
    s._dispatch(_step(1))
    first, status, last = _take(s, stream)
    assert _steps(first) == [0] and len(status.frames) == 1 and _steps(last) == [1]


def test_a_finished_request_ends_in_the_same_message_after_its_tokens():
    s, stream = _servicer()
    s._dispatch(_step(0))
    out = _step(1)
    out.failed = [type("F", (), {"key": (7, "a"), "error": errors.cancelled("gone")})()]
    s._dispatch(out)
    [response] = _take(s, stream)
    kinds = [f.WhichOneof("frame") for f in response.frames]
    assert kinds == ["result_tokens", "result_tokens", "request_failed"]
    assert "a" not in stream.active


def test_logprobs_are_filled_in_place():
    s, stream = _servicer()
    out = StepOutput(step=0)
    out.tokens = [TokenEvent((7, "a"), 5, 0, TokenLogprobs(-0.5, (5, 6), (-0.5, -1.5))),
                  TokenEvent((7, "b"), 6, 0, None)]
    s._dispatch(out)
    [response] = _take(s, stream)
    a, b = response.frames[0].result_tokens.logprobs
    assert a.logprob == -0.5 and list(a.top_token_ids) == [5, 6] and list(a.top_logprobs) == [-0.5, -1.5]
    assert b == type(b)()


def test_an_open_message_is_bounded_by_frames(monkeypatch):
    monkeypatch.setattr(outbox, "MAX_JOINED_FRAMES", 4)
    s, stream = _servicer()
    for i in range(10):
        s._dispatch(_step(i))
    assert [_steps(r) for r in _take(s, stream)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_an_open_message_is_bounded_by_bytes(monkeypatch):
    monkeypatch.setattr(outbox, "MAX_JOINED_BYTES", 3 * (len("a") + 16))
    s, stream = _servicer()
    for i in range(7):
        s._dispatch(_step(i))
    assert [_steps(r) for r in _take(s, stream)] == [[0, 1, 2], [3, 4, 5], [6]]


def test_an_error_or_the_end_queued_directly_closes_the_open_message():
    s, stream = _servicer()
    s._dispatch(_step(0))
    stream.outbox.put_last(errors.cancelled("the reader failed"))
    s._dispatch(_step(1))
    stream.outbox.put_last(None)
    s._dispatch(_step(2))
    first, error, second, end, third = _take(s, stream)
    assert _steps(first) == [0] and isinstance(error, errors.MstarError) and _steps(second) == [1]
    assert end is None and _steps(third) == [2]
