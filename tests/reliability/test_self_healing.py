"""R33-R35: a frozen generation process turns NOT_SERVING and fails fast; the launcher restarts a
crashed service; a failed engine exits so that it can be restarted. Real processes (the Stack of
`make run`), real signals, real Envoy in front."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import httpx
import pytest
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common.serving import LIVENESS
from services.stack.supervisor import RestartPolicy, Supervisor
from tests.reliability import probe
from tests.reliability.conftest import NULL_STEP
from tests.reliability.test_engine_faults import _ended_unavailable, _fails_fast, _start_streams

pytestmark = pytest.mark.reliability

STALL_S = 1.5  # preprocess --backend-stall-s in these rigs (default 5 s)


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


def test_r33_sigstop_generation_fails_waiting_requests_fast_and_recovers_on_sigcont(make_rig, figures):
    rig = make_rig(generation_args=NULL_STEP, preprocess_args=("--backend-stall-s", str(STALL_S)))
    generation = rig.child("generation")

    async def frozen():
        async with grpc.aio.insecure_channel(rig.grpc) as channel:
            calls = await _start_streams(api_grpc.InferenceServiceStub(channel), 3)
            generation.signal(signal.SIGSTOP)
            t0 = time.monotonic()
            records = await asyncio.gather(*(probe.collect_stream(c) for c in calls))
            failed_after = time.monotonic() - t0
        not_serving_after = await probe.wait_health(rig.preprocess, probe.NOT_SERVING, timeout_s=5)
        envoy_503_after = await _envoy_health(rig, 503, timeout_s=5)
        t1 = time.monotonic()
        await _fails_fast(rig, budget_s=1.0)  # new requests: UNAVAILABLE / 503, not a hang
        return records, failed_after, not_serving_after, envoy_503_after, time.monotonic() - t1

    try:
        records, failed_after, not_serving_after, envoy_503, new_fail = rig.run(frozen(), timeout_s=60)
        # Preprocess stays live while it waits for its backend: a liveness probe must not restart it.
        assert rig.run(probe.health(rig.preprocess, LIVENESS)) == probe.SERVING
    finally:
        generation.signal(signal.SIGCONT)
    figures["r33_fail_inflight_after_sigstop_s"] = round(failed_after, 3)
    figures["r33_new_requests_fail_in_s"] = round(new_fail, 3)
    for record in records:
        record.assert_one_terminal()
        assert _ended_unavailable(record), record
        assert record.failed is None or record.failed.reason == "BACKEND_STALLED", record.failed
    # Measured from the SIGSTOP; the silence started at the last frame, a heartbeat (0.5 s) earlier at most.
    assert STALL_S - 0.5 <= failed_after < STALL_S + 2.0, f"waiting requests failed after {failed_after:.2f} s"
    assert not_serving_after < 2.0 and envoy_503 < 4.0, (not_serving_after, envoy_503)

    # SIGCONT: the same process speaks again; preprocess and then Envoy serve again by themselves,
    # and the requests failed while it was frozen were aborted in the engine (KV back to baseline).
    t0 = time.monotonic()
    rig.run(probe.wait_health(rig.preprocess, probe.SERVING, timeout_s=10))
    figures["r33_serving_again_after_sigcont_s"] = round(time.monotonic() - t0, 3)
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
    for name in ("generation", "preprocess", "envoy"):
        old_pid = rig.child(name).pid
        seen = len(supervisor.events)
        t0 = time.monotonic()
        rig.child(name).signal(signal.SIGKILL)
        exited = _wait_event(supervisor, name, "exited", seen, timeout_s=5)
        assert "SIGKILL" in exited.message and "restarting in 0.2 s" in exited.message, exited.message
        _wait_event(supervisor, name, "ready", seen, timeout_s=60)
        waited = rig.run(probe.wait_canary(rig.grpc, timeout_s=30))
        figures[f"r34_{name}_kill_to_serving_s"] = round(time.monotonic() - t0, 3)
        assert rig.child(name).pid != old_pid and rig.child(name).alive()
        assert waited < 30
    # A crash loop backs off: after a stable spell (> stable_s) the delay starts at 0.2 s again,
    # and a second kill right after the restart doubles it.
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
