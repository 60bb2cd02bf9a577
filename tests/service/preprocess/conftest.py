"""Service-test harness: servers run on an asyncio loop in a background thread; tests use plain
synchronous gRPC stubs (no async test plugin needed)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from mstar.v1 import inference_service_pb2_grpc as api_grpc

from services.common.server import GrpcServer
from services.preprocess.admission import Admission
from services.preprocess.limits import Limits
from services.preprocess.media import FileReader
from services.preprocess.model import load_model
from services.preprocess.replica_pool import ReplicaPool
from services.preprocess.request_run import Deps
from services.preprocess.resolver import Resolver
from services.preprocess.servicer import InferenceServicer

sys.path.insert(0, str(Path(__file__).parent))
from fake_generation import start_fake  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="session")
def model():
    return load_model("default")


class Preprocess:
    """An in-process preprocess server in front of `generation_target` (one or several replicas,
    comma-separated)."""

    def __init__(self, loop: LoopThread, model, generation_target: str, **kw) -> None:
        self.loop = loop
        limits = kw.pop("limits", Limits())
        admission = kw.pop("admission", Admission())
        file_root = kw.pop("file_root", None)

        async def start():
            server = GrpcServer("preprocess", "127.0.0.1", 0)
            backend = ReplicaPool(Resolver(generation_target), kw.get("pool_config"), state=server.state)
            deps = Deps(
                model=model,
                backend=backend,
                admission=admission,
                limits=limits,
                files=FileReader(file_root, limits.max_file_bytes),
                keepalive_s=kw.get("keepalive_s", 2.0),
                input_idle_s=kw.get("input_idle_s", 60.0),
                input_lifetime_s=kw.get("input_lifetime_s", 300.0),
            )
            servicer = InferenceServicer(deps, server.state)
            server.add(api_grpc.add_InferenceServiceServicer_to_server, servicer, "mstar.v1.InferenceService")
            port = await server.start()
            server.state.serve()
            backend.start()
            return server, backend, servicer, port

        self.server, self.backend, self.servicer, self.port = loop.run(start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = api_grpc.InferenceServiceStub(self.channel)

    def wait_healthy(self, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while not self.backend.healthy:
            if time.monotonic() > end:
                raise TimeoutError("generation backend never became healthy")
            time.sleep(0.02)

    def close(self) -> None:
        self.channel.close()

        async def stop():
            await self.backend.close()
            await self.server.server.stop(None)

        self.loop.run(stop())


@pytest.fixture
def loop():
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture
def fake_stack(loop, model):
    """Preprocess in front of the contract fake (fast; model-independent behaviour)."""
    server, fake, port = loop.run(start_fake())
    pre = Preprocess(loop, model, f"127.0.0.1:{port}")
    pre.wait_healthy()
    pre.fake = fake
    yield pre
    pre.close()
    loop.run(server.stop(None))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_generation(*args: str, port: int | None = None) -> tuple[subprocess.Popen, int]:
    """The REAL generation service as a subprocess on a free port."""
    port = port or free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.generation", *args, "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, port
