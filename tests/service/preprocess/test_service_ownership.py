"""Issue 28: a running request belongs to the principal that started it (client.py `principal`).

Another principal's Cancel or Append by id finds nothing: cancelled false / NOT_FOUND, the same
answers as for an id nothing runs under, and the owner's request runs on untouched. A cancel that
arrives before its start is remembered for its own principal only: another tenant cannot plant
a cancel under an id someone else is about to use. Preprocess trusts `x-mstar-client` because
only Envoy (which sets or strips it) reaches it; here the test is that Envoy.
"""

from __future__ import annotations

import grpc
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import messages_pb2 as pb

A = (("x-mstar-client", "key-aaaaaaaaaaaaaaaa"),)
B = (("x-mstar-client", "key-bbbbbbbbbbbbbbbb"),)


def _start(request_id: str, max_tokens: int) -> api.GenerateStreamRequest:
    sampling = pb.SamplingParams(max_tokens=max_tokens)
    return api.GenerateStreamRequest(input=pb.PreprocessInput(
        request_id=request_id, text="Hello world, how are you today?", model_kwargs=pb.ModelKwargs(sampling=sampling)))


def test_another_principal_can_neither_cancel_nor_append_to_a_running_request(fake_stack):
    stub = fake_stack.stub
    call = stub.GenerateStream(_start("own-1", 5000), metadata=A, timeout=20)
    events = iter(call)
    assert next(events).accepted.request_id == "own-1"
    next(events)  # it runs
    assert not stub.Cancel(api.CancelRequest(request_id="own-1"), metadata=B).cancelled
    append = api.AppendRequest(append=pb.ClientAppend(request_id="own-1", text="more"))
    with pytest.raises(grpc.RpcError) as info:
        stub.Append(append, metadata=B)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as never_ran:
        stub.Append(api.AppendRequest(append=pb.ClientAppend(request_id="never-ran", text="x")), metadata=B)
    assert never_ran.value.details() == info.value.details().replace("own-1", "never-ran")
    next(events)  # still running, untouched
    assert stub.Cancel(api.CancelRequest(request_id="own-1"), metadata=A).cancelled  # the owner can
    assert list(events)[-1].complete.finish_reason == pb.FINISH_REASON_CANCELLED


def test_a_cancel_ahead_of_its_start_is_remembered_for_its_own_principal_only(fake_stack):
    stub = fake_stack.stub
    assert not stub.Cancel(api.CancelRequest(request_id="own-2"), metadata=B).cancelled
    mine = list(stub.GenerateStream(_start("own-2", 3), metadata=A, timeout=10))
    assert mine[-1].complete.finish_reason == pb.FINISH_REASON_LENGTH  # B's cancel did not touch it
    assert not stub.Cancel(api.CancelRequest(request_id="own-3"), metadata=A).cancelled
    ahead = list(stub.GenerateStream(_start("own-3", 5000), metadata=A, timeout=10))
    assert ahead[-1].complete.finish_reason == pb.FINISH_REASON_CANCELLED  # A's own cancel still counts
