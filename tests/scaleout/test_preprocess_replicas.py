"""Two real preprocess replicas behind real Envoy: Append/Cancel reach the owning replica whichever
replica receives them; a replica that drains (SIGTERM) costs no request, one that dies (kill -9)
costs at most a retryable 503 right after the kill.
Slow (own stacks)."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from conftest import shared_prefix
from mstar.v1 import messages_pb2 as pb
from streams import append, cancel, start_stream, wait_all

pytestmark = pytest.mark.slow


@pytest.fixture
def two_preprocess(scaleout):
    return scaleout(generation=2, preprocess=2)


def test_append_and_cancel_work_through_any_preprocess_replica(two_preprocess):
    rig = two_preprocess
    envoy = rig.stack.grpc_target
    a, b = rig.stack.preprocess_targets
    for request_id in ("client-chosen-7", ""):  # chosen by the client, or assigned (owner-tagged)
        stream = start_stream(a, shared_prefix(11)[:32], max_tokens=6, request_id=request_id, open_input=True)
        assert stream.accepted.wait(30) and stream.error is None, stream.error
        rid = stream.request_id
        total = 32
        for target in (b, a, envoy, envoy, envoy, envoy, b):  # the non-owner, the owner, either
            reply = append(target, rid, [300, 301], end=False)
            total += 2
            assert reply.request_id == rid and reply.prompt_tokens == total and not reply.input_ended
        assert append(b, rid, [302], end=True).input_ended
        assert not wait_all([stream], 30)
        assert stream.terminal.complete.usage.prompt_tokens == total + 1
        with pytest.raises(grpc.RpcError) as info:  # over: no replica runs it any more
            append(envoy, rid, [1], end=False)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

    held = start_stream(a, shared_prefix(12)[:32], max_tokens=6, open_input=True)
    assert held.accepted.wait(30)
    assert cancel(b, held.request_id)  # through the replica that does not run it
    assert not wait_all([held], 30)
    assert held.terminal.complete.finish_reason == pb.FINISH_REASON_CANCELLED
    assert not cancel(envoy, "nobody-runs-this")


def test_sigterm_of_a_preprocess_replica_loses_nothing(two_preprocess, figures):
    rig = two_preprocess
    envoy = rig.stack.grpc_target
    streams = [start_stream(envoy, shared_prefix(20 + i), max_tokens=300) for i in range(8)]
    deadline = time.monotonic() + 30
    while any(s.chunks == 0 for s in streams):
        assert time.monotonic() < deadline, "streams did not start"
        time.sleep(0.01)
    rig.kill("preprocess-1", signal.SIGTERM)
    statuses = []
    stop = time.monotonic() + 3.0  # new requests all through the drain: Envoy retries refusals
    while time.monotonic() < stop:
        reply = rig.generate(shared_prefix(40 + len(statuses)), max_tokens=2)
        statuses.append(reply.status_code if reply.status_code == 200 else (reply.status_code, reply.text))
    assert statuses and all(s == 200 for s in statuses), statuses
    assert not wait_all(streams, 60), "a stream hangs"
    assert all(s.terminal.complete.usage.completion_tokens == 300 for s in streams), [
        (s.terminal, s.error) for s in streams if not (s.terminal and s.terminal.HasField("complete"))]
    assert rig.wait_exit("preprocess-1") == 0
    figures["scaleout_preprocess_drain_new_requests"] = len(statuses)


def test_kill_9_of_a_preprocess_replica_new_requests_served_within_2_s(two_preprocess, figures):
    """A request that reaches a replica that just died is retried by Envoy on another one; in a few
    runs in ten Envoy sent all its attempts to the dead replica within ~0.1 s of the kill (the
    outlier ejection had not reached the retry yet) and the client got a retryable 503. So: a
    client that follows Retry-After is served within 2 s, and everything after is served."""
    rig = two_preprocess
    rig.kill("preprocess-1")
    killed = time.monotonic()
    refused = 0
    while (reply := rig.generate(shared_prefix(60), max_tokens=2, timeout_s=10)).status_code != 200:
        assert reply.status_code == 503 and time.monotonic() - killed < 2.0, reply.text
        refused += 1
        time.sleep(0.1)
    served_s = time.monotonic() - killed
    assert all(rig.generate(shared_prefix(61 + i), max_tokens=2).status_code == 200 for i in range(20))
    figures["scaleout_preprocess_kill9_served_s"] = round(served_s, 3)
    figures["scaleout_preprocess_kill9_refused"] = refused
