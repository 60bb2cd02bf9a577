"""The public contract at the preprocess boundary (issue 13): declared bounds before any work,
errors that never echo unbounded input, undecodable messages and servicer bugs mapped by the
interceptor, request ids in the logs, and Session attribution (one terminal event per request)."""

from __future__ import annotations

import logging
import queue
import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

MB = 1 << 20


def _input(text="Hello world, how are you today?", **kw):
    sampling = kw.pop("sampling", {})
    return pb.PreprocessInput(text=text, model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(**sampling)), **kw)


def _violations(err: grpc.RpcError) -> list[str]:
    for d in rpc_status.from_call(err).details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            return [v.field for v in bad.field_violations]
    return []


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if not isinstance(result, api.GenerateResponse | api.AppendResponse | api.CancelResponse):
            list(result)
    return info.value


class _Background:
    """A long request that must keep streaming while other calls are refused."""

    def __init__(self, stub) -> None:
        self.events: list = []
        self._thread = threading.Thread(target=self._run, args=(stub,), daemon=True)
        self._thread.start()

    def _run(self, stub) -> None:
        inp = _input("one two three four five six", sampling={"max_tokens": 300})
        for event in stub.GenerateStream(api.GenerateStreamRequest(input=inp), timeout=60):
            self.events.append(event.WhichOneof("event"))

    def finish(self) -> list:
        self._thread.join(60)
        return self.events


@pytest.mark.parametrize("where", ["Generate", "GenerateStream", "Session", "Append", "Cancel"])
def test_multi_megabyte_ids_are_refused_briefly_and_harm_nobody(fake_stack, where):
    # Issue 13, findings 1 and 10: unbounded ids reached every step frame of the shared stream
    # and were echoed into errors; now they are out of the declared bounds, refused before any
    # work, and the error quotes no part of them. A neighbour's stream is untouched.
    stub, big = fake_stack.stub, "i" * (2 * MB)
    neighbour = _Background(stub)
    if where == "Generate":
        err = _refused(lambda: stub.Generate(api.GenerateRequest(input=_input(request_id=big)), timeout=10))
    elif where == "GenerateStream":
        err = _refused(lambda: stub.GenerateStream(api.GenerateStreamRequest(input=_input(request_id=big)), timeout=10))
    elif where == "Append":
        err = _refused(lambda: stub.Append(api.AppendRequest(append=pb.ClientAppend(request_id=big, text="x")),
                                           timeout=10))
    elif where == "Cancel":
        err = _refused(lambda: stub.Cancel(api.CancelRequest(request_id=big), timeout=10))
    else:
        events = list(stub.Session(iter([api.SessionRequest(start=_input(request_id=big))]), timeout=10))
        failed = events[-1].failed
        assert failed.request_id == "" and failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "start.request_id" in failed.message and len(failed.message) < 300
        assert neighbour.finish()[-1] == "complete"
        return
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.details()) < 300 and "iiiiiiii" not in err.details()
    assert any(v.endswith("request_id") for v in _violations(err))
    assert neighbour.finish()[-1] == "complete"


@pytest.mark.parametrize("field, value", [
    ("model", "m" * MB),
    ("client_request_id", "c" * MB),
])
def test_oversized_strings_are_refused_without_echo(fake_stack, field, value):
    err = _refused(lambda: fake_stack.stub.Generate(api.GenerateRequest(input=_input(**{field: value})), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violations(err) == [f"input.{field}"] and len(err.details()) < 300


def test_an_unknown_extra_key_is_named_but_only_a_short_prefix_of_it(fake_stack):
    inp = _input()
    inp.model_kwargs.extra.update({"k" * MB: 1})
    err = _refused(lambda: fake_stack.stub.Generate(api.GenerateRequest(input=inp), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.details()) < 300 and "(1048576 characters)" in err.details()


@pytest.mark.parametrize("field, build", [
    ("input.prompt_parts", lambda: _input("", prompt_parts=[pb.PromptPart(text="a")] * 50_000)),
    ("input.messages", lambda: _input("", messages=[pb.ChatMessage(role="user", content="hi")] * 50_000)),
    ("input.prompt_parts[0].token_ids.ids", lambda: _input("", prompt_parts=[
        pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=[5] * 1_100_000))])),
])
def test_huge_repeated_fields_are_refused_from_their_counts(fake_stack, field, build):
    # Issue 13, finding 2: many parts or messages were turned into objects and rendered by the
    # template before any size cap applied, stalling every stream on the event loop.
    err = _refused(lambda: fake_stack.stub.Generate(api.GenerateRequest(input=build()), timeout=20))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violations(err) == [field]


def test_a_prompt_that_cannot_fit_is_refused_before_the_template(fake_stack, model, monkeypatch):
    # 1,000 messages of 1,000 characters cannot fit an 8k context whatever they tokenize to: the
    # cost estimate refuses them without rendering the template or tokenizing.
    rendered = []
    monkeypatch.setattr(type(model.chat_template), "render", lambda self, *a, **k: rendered.append(1) or "")
    messages = [pb.ChatMessage(role="user", content="z" * 1000)] * 1000
    assert 1000 * 1000 // model.tokenizer.max_token_bytes >= model.context_length
    err = _refused(lambda: fake_stack.stub.Generate(api.GenerateRequest(input=_input("", messages=messages)),
                                                    timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "PROMPT_TOO_LONG" in str(rpc_status.from_call(err))
    assert not rendered


def test_undecodable_bytes_on_the_public_port_are_invalid_argument(fake_stack):
    # Issue 13, finding 4: they were UNKNOWN (HTTP 500 through Envoy).
    channel = grpc.insecure_channel(f"127.0.0.1:{fake_stack.port}")
    generate = channel.unary_unary("/mstar.v1.InferenceService/Generate",
                                   request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
    session = channel.stream_stream("/mstar.v1.InferenceService/Session",
                                    request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
    try:
        garbage = b"\x0a\xff\xff\xff\xff\x0f not a message"
        with pytest.raises(grpc.RpcError) as info:
            generate(garbage, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "mstar.v1.GenerateRequest" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            list(session(iter([garbage]), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "mstar.v1.SessionRequest" in info.value.details()
    finally:
        channel.close()


def test_a_servicer_bug_is_internal_with_a_logged_stack_and_no_exception_text(fake_stack, monkeypatch, caplog):
    class Broken:  # a dependency that fails the way a bug would
        @property
        def model(self):
            raise RuntimeError("secret internal detail")

    monkeypatch.setattr(fake_stack.servicer.runner, "deps", Broken())
    with caplog.at_level(logging.INFO):
        with pytest.raises(grpc.RpcError) as info:
            fake_stack.stub.ListModels(api.ListModelsRequest(), timeout=10,
                                       metadata=(("x-request-id", "trace-me-123"),))
        access = _access_lines(caplog, 1)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in info.value.details()
    logged = [r for r in caplog.records if r.exc_info and "secret internal detail" in str(r.exc_info[1])]
    assert logged and logged[0].x_request_id == "trace-me-123", "the stack was not logged with the request id"
    assert access[-1].rpc.endswith("/ListModels") and access[-1].code == "INTERNAL"


def _access_lines(caplog, n: int) -> list:
    """The access log lines, once there are n: each is written as its call unwinds, just after
    the client got its reply."""
    deadline = time.monotonic() + 5
    while len(lines := [r for r in caplog.records if r.name == "mstar.access"]) < n:
        assert time.monotonic() < deadline, lines
        time.sleep(0.01)
    return lines


def test_every_rpc_writes_one_access_line_carrying_the_request_id(fake_stack, caplog):
    from services.common.logs import JsonFormatter

    with caplog.at_level(logging.INFO):
        fake_stack.stub.Generate(api.GenerateRequest(input=_input(sampling={"max_tokens": 2})), timeout=10,
                                 metadata=(("x-request-id", "edge-42"),))
        with pytest.raises(grpc.RpcError):
            fake_stack.stub.Generate(api.GenerateRequest(input=_input(model="nope")), timeout=10)
        access = _access_lines(caplog, 2)
    assert [r.code for r in access] == ["OK", "NOT_FOUND"]
    import json

    first = json.loads(JsonFormatter().format(access[0]))
    assert first["x_request_id"] == "edge-42" and first["rpc"] == "/mstar.v1.InferenceService/Generate"
    done = [r for r in caplog.records if r.getMessage() == "request done"]
    assert done and json.loads(JsonFormatter().format(done[0]))["x_request_id"] == "edge-42"
    second = json.loads(JsonFormatter().format(access[1]))
    assert second["x_request_id"] not in ("", "edge-42")  # generated when the caller sent none


# ---- Session attribution (finding 6)


class _Session:
    def __init__(self, stub) -> None:
        self.out: queue.Queue = queue.Queue()
        self.call = stub.Session(iter(self.out.get, None), timeout=30)

    def send(self, *messages) -> None:
        for m in messages:
            self.out.put(m)

    def close(self) -> None:
        self.out.put(None)


def _terminal_counts(events) -> dict[str, int]:
    counts: dict[str, int] = {}
    after_terminal = []
    for e in events:
        kind = e.WhichOneof("event")
        rid = getattr(e, kind).request_id
        if rid in counts and rid:
            after_terminal.append((rid, kind))
        if kind in ("complete", "failed"):
            counts[rid] = counts.get(rid, 0) + 1
    assert not after_terminal, f"events after a terminal one: {after_terminal}"
    return counts


def test_a_refused_start_without_an_id_is_matched_by_client_request_id(fake_stack):
    bad = _input(client_request_id="mine-1", sampling={"temperature": 5.0})
    events = list(fake_stack.stub.Session(iter([api.SessionRequest(start=bad)]), timeout=10))
    assert len(events) == 1
    failed = events[0].failed
    # It never got a server id: empty, not one the client never saw; its own id is echoed.
    assert failed.request_id == "" and failed.client_request_id == "mine-1"
    assert failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and failed.http_status == 400


def test_a_duplicate_start_is_refused_without_ending_the_running_request(fake_stack):
    s = _Session(fake_stack.stub)
    s.send(api.SessionRequest(start=_input("a b c d e f", request_id="dup", sampling={"max_tokens": 40})))
    events = []
    for event in s.call:
        events.append(event)
        kind = event.WhichOneof("event")
        if kind == "accepted":
            s.send(api.SessionRequest(start=_input(request_id="dup", client_request_id="second")))
        if kind == "failed":
            assert event.failed.request_id == "" and event.failed.client_request_id == "second"
            assert event.failed.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
        if kind == "complete":
            s.close()
    assert _terminal_counts(events) == {"dup": 1, "": 1}
    assert events[-1].WhichOneof("event") == "complete" and events[-1].complete.usage.completion_tokens == 40


def test_appends_to_a_finished_request_never_add_a_second_terminal_event(fake_stack):
    s = _Session(fake_stack.stub)
    s.send(api.SessionRequest(start=_input("a b", request_id="done-1", sampling={"max_tokens": 2})))
    events = []
    for event in s.call:
        events.append(event)
        kind = event.WhichOneof("event")
        if kind == "complete":
            s.send(api.SessionRequest(append=pb.ClientAppend(request_id="done-1", text="late")),
                   api.SessionRequest(append=pb.ClientAppend(request_id="never-was", text="x")))
        if kind == "failed":
            assert event.failed.request_id == ""  # refusals name no request
            if sum(e.WhichOneof("event") == "failed" for e in events) == 2:
                s.close()
    assert _terminal_counts(events) == {"done-1": 1, "": 2}


def test_a_bad_append_ends_its_running_request_exactly_once(fake_stack):
    s = _Session(fake_stack.stub)
    start = _input("a b", request_id="open-1", sampling={"max_tokens": 4})
    start.input_modalities.append(pb.MODALITY_TEXT)
    s.send(api.SessionRequest(start=start))
    events = []
    for event in s.call:
        events.append(event)
        kind = event.WhichOneof("event")
        if kind == "accepted":
            bad = pb.PromptPart(modality=pb.MODALITY_TOKENS, token_ids=pb.TokenIds(ids=[10**9]))
            s.send(api.SessionRequest(append=pb.ClientAppend(request_id="open-1", chunks=[bad])))
        if kind in ("failed", "complete"):
            s.close()
    assert _terminal_counts(events) == {"open-1": 1}
    assert events[-1].failed.request_id == "open-1"
    assert events[-1].failed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_a_stream_s_complete_reports_its_path_and_its_transfers(fake_stack):
    # RequestComplete.node_timings / rx / tx: produced, not left for clients to find empty.
    inp = _input(sampling={"max_tokens": 5})
    events = list(fake_stack.stub.GenerateStream(api.GenerateStreamRequest(input=inp), timeout=10))
    done = events[-1].complete
    assert [n.node for n in done.node_timings] == ["preprocess", "generation", "postprocess"]
    assert all(n.duration_ms >= 0 for n in done.node_timings)
    assert done.rx.messages == 1 and done.rx.bytes == inp.ByteSize()
    assert done.tx.messages == len(events) - 1 and done.tx.bytes == sum(e.ByteSize() for e in events[:-1])
