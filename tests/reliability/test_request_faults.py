"""Issue 28: a fault in one request's own work, in the real generation process over the real wire.

MSTAR_FAULTS `request_fault_at_step=N:STAGE` makes the first request whose work reaches STAGE
raise there (services/generation/faults.py) — in the engine's stages (sample, token, finish) and
the servicer's (output). Among 8 streams in one batch, exactly that request ends with INTERNAL
(REQUEST_FAULT, an error id); the other 7 finish with every token; the generation process is
the same process afterwards (no restart), idle at its KV baseline, and serves the next request.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from tests.reliability import probe
from tests.reliability.conftest import NULL_STEP

pytestmark = pytest.mark.reliability

INTERNAL = grpc.StatusCode.INTERNAL.value[0]
N, MAX_TOKENS = 8, 40


@pytest.mark.parametrize("stage", ["sample", "token", "finish", "output"])
def test_a_fault_in_one_requests_work_fails_it_alone_and_the_process_lives_on(make_rig, stage):
    rig = make_rig(faults=f"request_fault_at_step=2:{stage}", generation_args=NULL_STEP)
    pid = rig.child("generation").pid

    async def scenario():
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            inputs = [probe.text_input(f"request {i}", MAX_TOKENS, ignore_eos=True) for i in range(N)]
            calls = [stub.GenerateStream(api.GenerateStreamRequest(input=i)) for i in inputs]
            for call in calls:
                assert (await call.read()).WhichOneof("event") == "accepted"
            await probe.wait_running(rig.generation, N)
            rig.arm()
            return await asyncio.gather(*(probe.collect_stream(c) for c in calls))

    records = rig.run(scenario(), timeout_s=120)
    failed = [r for r in records if r.failed is not None]
    assert len(failed) == 1, [(r.events[-1:], r.failed) for r in records]
    error = failed[0].failed
    assert error.code == INTERNAL and error.reason == "REQUEST_FAULT", error
    assert "error id" in error.message and "InjectedFault" not in error.message
    for record in records:
        record.assert_one_terminal()
        if record.failed is None:
            assert record.complete.usage.completion_tokens == MAX_TOKENS
    rig.check_recovered()  # blocks back, nothing running, a canary served
    assert rig.child("generation").pid == pid and rig.child("generation").alive()
