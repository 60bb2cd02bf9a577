"""services/common/serving.py: one state per process, read by health, servicers and the engine."""

from __future__ import annotations

import asyncio
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.errors import Code
from services.common.server import GrpcServer
from services.common.serving import LIVENESS, ServingState, State


def test_transitions_are_one_way_and_failed_is_latched():
    s = ServingState("svc")
    assert s.state is State.STARTING and not s.is_ready and s.is_live and s.accepts_work
    assert s.serve() and s.is_ready
    assert s.drain() and s.state is State.DRAINING and not s.accepts_work
    assert not s.serve()  # a draining server never turns SERVING again
    assert s.fail("ENGINE_FAILED", "boom") and not s.is_live
    assert not s.drain() and not s.serve() and s.state is State.FAILED


def test_refusal_names_the_reason_new_work_cannot_start():
    s = ServingState("svc")
    assert s.refusal().reason == "STARTING" and s.refusal().code == Code.UNAVAILABLE
    s.serve()
    assert s.refusal() is None
    s.set_dependency("generation", False, "BACKEND_STALLED", "silent for 5 s")
    err = s.refusal()
    assert (err.reason, err.message) == ("BACKEND_STALLED", "silent for 5 s") and not s.is_ready
    assert s.is_live  # waiting for a dependency is no reason to restart the process
    s.set_dependency("generation", True)
    assert s.refusal() is None and s.is_ready
    s.fail("ENGINE_STALLED", "no progress for 30 s")
    err = s.refusal()
    assert err.reason == "ENGINE_STALLED" and err.retry_after_s is None  # retry elsewhere, not here


def test_listeners_hear_every_change_from_any_thread():
    s = ServingState("svc")
    seen = []
    s.on_change(lambda st: seen.append((st.state, st.is_ready)))
    s.serve()
    t = threading.Thread(target=s.fail, args=("ENGINE_FAILED", "x"))
    t.start()
    t.join()
    s.set_dependency("d", True)  # already up: no change, no call
    assert seen == [(State.STARTING, False), (State.SERVING, True), (State.FAILED, False)]


def test_grpc_health_follows_the_state_and_liveness_only_fails_when_failed():
    async def scenario():
        server = GrpcServer("svc", "127.0.0.1", 0)
        port = await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status(name=""):
                await asyncio.sleep(0.05)  # updates are scheduled on the loop
                return (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status

            seen = [await status(), await status(LIVENESS)]
            server.state.serve()
            seen += [await status()]
            server.state.set_dependency("backend", False)
            seen += [await status(), await status(LIVENESS)]
            server.state.set_dependency("backend", True)
            threading.Thread(target=server.state.fail, args=("ENGINE_FAILED", "x")).start()
            seen += [await status(), await status(LIVENESS)]
        await server.server.stop(None)
        return seen

    S, N = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert asyncio.run(scenario()) == [N, S, S, N, S, N, N]
