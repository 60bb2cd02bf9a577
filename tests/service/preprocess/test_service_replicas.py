"""Two in-process preprocess replicas in front of two contract fakes, as Envoy would see them:
Append/Cancel/Session actions reach the owning replica whichever replica receives them, ids the
server assigns name their owner, and a draining replica's refusals are marked for Envoy's retry."""

from __future__ import annotations

import grpc
import pytest
from conftest import Preprocess
from fake_generation import start_fake
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

from services.common.grpc_errors import REFUSED
from services.preprocess.peers import Peers, owner_tag
from services.preprocess.resolver import Resolver


@pytest.fixture
def two_replicas(loop, model):
    fakes = [loop.run(start_fake()) for _ in range(2)]
    generation = ",".join(f"127.0.0.1:{port}" for _, _, port in fakes)
    pres = [Preprocess(loop, model, generation) for _ in range(2)]
    addresses = [f"127.0.0.1:{p.port}" for p in pres]

    async def connect(pre, me):
        pre.servicer.peers = Peers(Resolver(",".join(addresses)), advertise=me)
        await pre.servicer.peers.refresh()

    for pre, me in zip(pres, addresses, strict=True):
        pre.wait_healthy()
        loop.run(connect(pre, me))
    yield pres
    for pre in pres:
        loop.run(pre.servicer.peers.close())
        pre.close()
    for server, _, _ in fakes:
        loop.run(server.stop(None))


def open_request(pre: Preprocess, request_id: str = "", max_tokens: int = 4):
    start = pb.PreprocessInput(request_id=request_id, input_modalities=[pb.MODALITY_TEXT],
                               model_kwargs=pb.ModelKwargs(sampling=pb.SamplingParams(max_tokens=max_tokens)))
    events = iter(pre.stub.GenerateStream(api.GenerateStreamRequest(input=start), timeout=20))
    return next(events).accepted.request_id, events


def append(pre: Preprocess, request_id: str, text: str, end: bool = False) -> api.AppendResponse:
    message = pb.ClientAppend(request_id=request_id, text=text, ends=[pb.MODALITY_TEXT] if end else [])
    return pre.stub.Append(api.AppendRequest(append=message), timeout=10)


def test_a_server_assigned_id_names_its_owner(two_replicas):
    a, b = two_replicas
    rid, events = open_request(a)
    assert rid.rsplit("-", 1)[1] == owner_tag(f"127.0.0.1:{a.port}") != owner_tag(f"127.0.0.1:{b.port}")
    assert b.stub.Cancel(api.CancelRequest(request_id=rid), timeout=10).cancelled
    assert list(events)[-1].complete.finish_reason == pb.FINISH_REASON_CANCELLED


def test_append_through_either_replica_reaches_the_owner(two_replicas, model):
    a, b = two_replicas
    rid, events = open_request(a, "client-chosen-1")
    reply = append(b, rid, "Hello there,")  # answered by the owner (a): it counts the tokens so far
    assert reply.request_id == rid and reply.prompt_tokens > 0 and not reply.input_ended
    append(a, rid, " general Kenobi")
    reply = append(b, rid, "", end=True)
    assert reply.input_ended
    text = "Hello there, general Kenobi"
    rest = list(events)
    assert rest[-1].complete.usage.prompt_tokens == len(model.tokenizer.encode(text))
    assert "".join(e.chunk.text for e in rest if e.HasField("chunk")) == model.tokenizer.decode(
        model.tokenizer.encode(text)[:4])
    with pytest.raises(grpc.RpcError) as info:  # finished: nobody runs it any more
        append(b, rid, "x")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:  # the owner's own answers come back through the peer
        rid2, _ = open_request(a, "client-chosen-2")
        append(b, rid2, "", end=True)
        append(b, rid2, "more")
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_session_actions_for_a_request_another_replica_runs(two_replicas):
    a, b = two_replicas
    rid, events = open_request(a, max_tokens=2000)

    def actions():
        yield api.SessionRequest(append=pb.ClientAppend(request_id=rid, text="Hi", ends=[pb.MODALITY_TEXT]))
        yield api.SessionRequest(cancel=api.SessionCancel(request_id=rid))

    session = list(b.stub.Session(actions(), timeout=20))
    assert not [e for e in session if e.HasField("failed")], session
    assert list(events)[-1].complete.finish_reason == pb.FINISH_REASON_CANCELLED


def test_a_draining_replica_refuses_with_the_retry_marker(two_replicas):
    a, _ = two_replicas
    a.servicer.state.drain()  # one-way: the fixture's teardown stops it anyway
    with pytest.raises(grpc.RpcError) as info:
        a.stub.Generate(api.GenerateRequest(input=pb.PreprocessInput(text="hi")), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(info.value.trailing_metadata())[REFUSED] == "DRAINING"
