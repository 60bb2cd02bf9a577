"""R33-R35: a frozen generation process turns NOT_SERVING, sheds new requests at once and lets
the ones in flight finish when it resumes; the launcher restarts a crashed service; a failed engine exits so that it can be restarted. Real processes (the Stack of
`make run`), real signals, real Envoy in front."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common.serving import LIVENESS
from services.stack.supervisor import RestartPolicy, Supervisor
from tests.reliability import probe
from tests.reliability.conftest import NULL_STEP
from tests.reliability.test_engine_faults import _ended_unavailable

pytestmark = pytest.mark.reliability

STALL_S = 1.5  # preprocess --backend-stall-s in these rigs (default 5 s)
FREEZE_S = 4.0  # how long R33 keeps the generation stopped: stalled for the last ~2.5 s of it


async def _envoy_health(rig, want: int, timeout_s: float) -> float:
    """Seconds until Envoy's GET /health answers `want` (200 or 503)."""
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=rig.http, timeout=2) as client:
        while True:
            status = (await client.get("/health")).status_code
            if status == want:
                return time.monotonic() - start
            assert time.monotonic() - start < timeout_s, f"/health is {status}, wanted {want}"
            await asyncio.sleep(0.05)


async def _shed_with_retry_advice(rig) -> None:
    """A new request is refused at once: by preprocess with UNAVAILABLE and a retry delay
    (RetryInfo; refused, so Envoy may replay it on another replica), and through Envoy, which
    stops routing to a NOT_SERVING replica, as gRPC UNAVAILABLE and HTTP 503."""
    for target in (rig.preprocess, rig.grpc):
        async with grpc.aio.insecure_channel(target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await api_grpc.InferenceServiceStub(channel).Generate(
                    api.GenerateRequest(input=probe.text_input(max_tokens=4)), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        if target == rig.preprocess:
            details = rpc_status.from_call(info.value).details
            assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in details), info.value
    async with httpx.AsyncClient(base_url=rig.http, timeout=10) as client:
        native = await client.post("/v1/generate", json={"text": "hi"})
        openai = await client.post("/v1/completions", json={"model": "default", "prompt": "hi", "max_tokens": 4})
    assert native.status_code == 503 and openai.status_code == 503, (native.text, openai.text)


def test_r33_sigstop_sheds_new_requests_and_lets_in_flight_ones_finish_on_sigcont(make_rig, figures):
    """A frozen generation (SIGSTOP) is stalled after --backend-stall-s: preprocess NOT_SERVING,
    Envoy /health 503, new requests refused at once with a retry delay; the requests in flight wait
    for it (issue 28: a 10 s freeze failed them all with BACKEND_STALLED), and after SIGCONT they
    finish with every token, except one whose deadline passed meanwhile (DEADLINE_EXCEEDED)."""
    rig = make_rig(generation_args=NULL_STEP, preprocess_args=("--backend-stall-s", str(STALL_S)))
    generation = rig.child("generation")
    max_tokens = 100  # 2 s at 20 ms a step: still running when the freeze starts

    def stream(stub, timeout=None):
        request = api.GenerateStreamRequest(input=probe.text_input(max_tokens=max_tokens, ignore_eos=True))
        return stub.GenerateStream(request, timeout=timeout)

    async def frozen():
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            calls = [stream(stub) for _ in range(3)] + [stream(stub, timeout=STALL_S + 1.0)]  # ends frozen
            for call in calls:
                assert (await call.read()).WhichOneof("event") == "accepted"
            collected = [asyncio.create_task(probe.collect_stream(c)) for c in calls]
            generation.signal(signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                not_serving_after = await probe.wait_health(rig.preprocess, probe.NOT_SERVING, timeout_s=5)
                envoy_503_after = await _envoy_health(rig, 503, timeout_s=5)
                t1 = time.monotonic()
                await _shed_with_retry_advice(rig)
                shed_in = time.monotonic() - t1
                # Preprocess stays live while it waits for its backend: a liveness probe must not restart it.
                assert await probe.health(rig.preprocess, LIVENESS) == probe.SERVING
                await asyncio.sleep(FREEZE_S - (time.monotonic() - t0))
                assert not any(task.done() for task in collected[:3]), "a request in flight ended during the freeze"
            finally:
                generation.signal(signal.SIGCONT)
            t2 = time.monotonic()
            serving_again = await probe.wait_health(rig.preprocess, probe.SERVING, timeout_s=10)
            records = await asyncio.gather(*collected)
            return records, not_serving_after, envoy_503_after, shed_in, serving_again, time.monotonic() - t2

    try:
        records, not_serving_after, envoy_503, shed_in, serving_again, finished_in = rig.run(frozen(), timeout_s=60)
    finally:
        generation.signal(signal.SIGCONT)
    figures["r33_not_serving_after_sigstop_s"] = round(not_serving_after, 3)
    figures["r33_new_requests_shed_in_s"] = round(shed_in, 3)
    figures["r33_in_flight_finished_after_sigcont_s"] = round(finished_in, 3)
    figures["r33_serving_again_after_sigcont_s"] = round(serving_again, 3)
    *in_flight, short = records
    for record in in_flight:
        record.assert_one_terminal()
        assert record.complete is not None, (record.events[-2:], record.failed, record.status)
        assert record.complete.usage.completion_tokens == max_tokens, record.complete
    assert short.status == grpc.StatusCode.DEADLINE_EXCEEDED, short
    # Measured from the SIGSTOP; the silence started at the last frame, a heartbeat (0.5 s) earlier at most.
    assert STALL_S - 0.5 <= not_serving_after < STALL_S + 2.0, f"NOT_SERVING after {not_serving_after:.2f} s"
    assert envoy_503 < 4.0 and shed_in < 2.0, (envoy_503, shed_in)

    # SIGCONT: the same process speaks again; preprocess and then Envoy serve again by themselves,
    # and the request whose deadline passed while it was frozen was aborted there (KV back to baseline).
    assert serving_again < 2.0, serving_again
    rig.run(probe.wait_canary(rig.grpc, timeout_s=20))
    rig.check_recovered()


def _wait_event(supervisor: Supervisor, child: str, what: str, after: int, timeout_s: float):
    """Poll the supervisor (from this thread, as `make run` does from its main thread: a child dies
    with the thread that started it, PR_SET_PDEATHSIG) until `child` reports `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        supervisor.poll()
        found = [e for e in supervisor.events[after:] if e.child == child and e.what == what]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {what!r} event for {child} in {timeout_s}s: {[e.message for e in supervisor.events]}")


@pytest.mark.slow  # ~40 s: three restarts and a crash loop; the policy itself is unit-tested
def test_r34_supervisor_restarts_killed_services_and_the_stack_serves_again(make_rig, figures):
    rig = make_rig(generation_args=NULL_STEP)
    supervisor = Supervisor(rig.stack, RestartPolicy(initial_backoff_s=0.2, max_backoff_s=2.0, stable_s=5.0),
                            report=lambda message: None)
    ready_at = time.monotonic()  # when generation last came back
    for name in ("generation", "preprocess", "envoy"):
        old_pid = rig.child(name).pid
        seen = len(supervisor.events)
        t0 = time.monotonic()
        rig.child(name).signal(signal.SIGKILL)
        exited = _wait_event(supervisor, name, "exited", seen, timeout_s=5)
        assert "SIGKILL" in exited.message and "restarting in 0.2 s" in exited.message, exited.message
        _wait_event(supervisor, name, "ready", seen, timeout_s=60)
        ready_at = ready_at if name != "generation" else time.monotonic()
        waited = rig.run(probe.wait_canary(rig.grpc, timeout_s=30))
        figures[f"r34_{name}_kill_to_serving_s"] = round(time.monotonic() - t0, 3)
        assert rig.child(name).pid != old_pid and rig.child(name).alive()
        assert waited < 30
    # A crash loop backs off: after a stable spell (> stable_s) the delay starts at 0.2 s again,
    # and a second kill right after the restart doubles it. The spell is waited for: restarting
    # preprocess and Envoy can take less than stable_s on a fast box.
    time.sleep(max(0.0, 5.0 + 0.5 - (time.monotonic() - ready_at)))
    seen = len(supervisor.events)
    rig.child("generation").signal(signal.SIGKILL)
    _wait_event(supervisor, "generation", "restarted", seen, timeout_s=10)
    rig.child("generation").signal(signal.SIGKILL)
    _wait_event(supervisor, "generation", "exited", len(supervisor.events), timeout_s=10)
    second = [e for e in supervisor.events[seen:] if e.what == "exited"]
    assert "restarting in 0.2 s" in second[0].message, second[0].message
    assert "restarting in 0.4 s" in second[1].message, second[1].message
    _wait_event(supervisor, "generation", "ready", seen, timeout_s=60)
    rig.run(probe.wait_canary(rig.grpc, timeout_s=30))
    # This process's gRPC may still hold a connection to a killed generation: reconnect first.
    rig.run(probe.wait_health(rig.generation, probe.SERVING, timeout_s=10))
    rig.record_baseline()
    rig.check_recovered(timeout_s=30)


@pytest.mark.slow  # ~25 s; the exit with status 3 alone is R06 (fast)
def test_r35_a_failed_engine_exits_3_and_comes_back_under_the_supervisor(make_rig, figures):
    rig = make_rig(faults="forward_raise_at_step=1", generation_args=(*NULL_STEP, "--failed-exit-s", "0.5"))
    supervisor = Supervisor(rig.stack, RestartPolicy(initial_backoff_s=0.2), report=lambda message: None)

    async def fail() -> None:
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            stub = api_grpc.InferenceServiceStub(channel)
            call = stub.GenerateStream(api.GenerateStreamRequest(input=probe.text_input(max_tokens=500)))
            rig.arm()
            record = await probe.collect_stream(call)
        assert _ended_unavailable(record), record

    t0 = time.monotonic()
    rig.run(fail(), timeout_s=30)
    # The restarted process inherits the fault spec; without the arm file it never fires.
    rig.arm_file.unlink()
    exited = _wait_event(supervisor, "generation", "exited", 0, timeout_s=15)
    assert "exited with status 3" in exited.message, exited.message
    _wait_event(supervisor, "generation", "ready", 0, timeout_s=60)
    rig.run(probe.wait_canary(rig.grpc, timeout_s=30))
    figures["r35_engine_failure_to_serving_again_s"] = round(time.monotonic() - t0, 3)
    rig.run(probe.wait_health(rig.generation, probe.SERVING, timeout_s=10))
    rig.record_baseline()
    rig.check_recovered(timeout_s=30)
