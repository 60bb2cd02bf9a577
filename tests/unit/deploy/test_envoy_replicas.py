"""The rendered Envoy config in front of two preprocess replicas (fake_upstream.py): every replica
gets traffic, a replica that refuses a new request (draining) or is gone is skipped by a retry,
and a client cannot send the internal `mstar-forwarded` marker."""

import dataclasses
import sys
from collections import Counter
from pathlib import Path

import grpc
import httpx
import pytest
from mstar.v1 import inference_service_pb2 as ipb
from mstar.v1 import inference_service_pb2_grpc as ipb_grpc

from deploy.envoy.render import VARIANTS
from services.stack import readiness
from services.stack.envoy import start_envoy
from services.stack.ports import free_port
from services.stack.process import Child

HERE = Path(__file__).resolve().parent


def fake(tmp: Path, name: str, *flags: str) -> tuple[Child, int]:
    port = free_port()
    child = Child(name, [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port), "--name", name,
                         *flags], tmp / f"{name}.log")
    readiness.poll(name, readiness.grpc_serving(f"127.0.0.1:{port}"), 30, alive=child.alive)
    return child, port


@pytest.fixture
def replicas(tmp_path):
    children = []

    def start(*specs: tuple[str, ...]) -> tuple[str, list[Child]]:
        fakes = [fake(tmp_path, *spec) for spec in specs]
        children.extend(child for child, _ in fakes)
        settings = dataclasses.replace(VARIANTS["local"], http_port=free_port(), admin_port=free_port(),
                                       upstream_ports=tuple(port for _, port in fakes))
        envoy = start_envoy(settings, tmp_path)
        children.append(envoy)
        base = f"http://127.0.0.1:{settings.http_port}"
        admin = f"http://127.0.0.1:{settings.admin_port}"
        # Both hosts passed their first health check (healthy_threshold 1).
        readiness.poll("both healthy", lambda: httpx.get(admin + "/clusters").text.count("health_flags::healthy")
                       == len(specs), 30, alive=envoy.alive)
        return base, [child for child, _ in fakes]

    yield start
    for child in reversed(children):
        child.stop(5)


def served_by(base: str, n: int) -> Counter:
    with grpc.insecure_channel(base.removeprefix("http://")) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)
        grpc_names = [stub.ListModels(ipb.ListModelsRequest(), timeout=5).data[0].id for _ in range(n)]
    http_names = [httpx.get(base + "/v1/models", timeout=5).json()["data"][0]["id"] for _ in range(n)]
    return Counter(grpc_names + http_names)


def test_new_requests_reach_every_replica(replicas):
    base, _ = replicas(("a",), ("b",))
    counts = served_by(base, 30)
    assert set(counts) == {"a", "b"} and min(counts.values()) >= 10, counts


def test_a_replica_that_refuses_new_requests_is_skipped_by_one_retry(replicas):
    base, _ = replicas(("draining", "--refuse"), ("b",))
    assert served_by(base, 20) == Counter({"b": 40})  # not one 503 although "draining" is still healthy
    reply = httpx.post(base + "/v1/generate", json={"text": "hi"}, timeout=5)
    assert reply.status_code == 200 and reply.json()["text"] == "Hello world"


def test_a_killed_replica_costs_no_request(replicas):
    base, (a, _) = replicas(("a",), ("b",))
    a.stop(0)  # SIGTERM then SIGKILL at once: connections refused from now on
    assert served_by(base, 20) == Counter({"b": 40})


def test_clients_cannot_send_the_internal_forwarded_marker(replicas):
    base, _ = replicas(("a",))
    reply = httpx.post(base + "/v1/generate", json={"text": "forwarded?"}, headers={"mstar-forwarded": "1"}, timeout=5)
    assert reply.json()["text"] == "a:False"
    with grpc.insecure_channel(base.removeprefix("http://")) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)
        answer = stub.Generate(ipb.GenerateRequest(input={"text": "forwarded?"}), metadata=(("mstar-forwarded", "1"),))
    assert answer.text == "a:False"
