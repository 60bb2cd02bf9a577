"""Start/stop `python -m services.generation` as a subprocess (unique module name: test dirs share sys.path)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def start_server(model_dir: str, *args: str, timeout_s: float = 60.0):
    """Start `python -m services.generation` on port 0; return (process, port) once SERVING."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.generation", "--model", model_dir, "--port", "0", "--host", "127.0.0.1",
         "--device", "cpu", "--threads", "1", *args],
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"listening on port (\d+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"server did not report its port: {line!r}")
    port = int(match.group(1))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return proc, port
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server never became SERVING")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
