"""Readiness probes for the stack: gRPC health SERVING, Envoy /ready, one real request."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc


class NotReady(RuntimeError):
    pass


def poll(what: str, check: Callable[[], bool], timeout_s: float, alive: Callable[[], bool] = lambda: True,
         every_s: float = 0.1) -> None:
    """Call `check` until it returns True; give up on timeout or when `alive()` turns False."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise NotReady(f"{what}: process exited")
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - any failure just means "not yet"
            last_error = exc
        time.sleep(every_s)
    raise NotReady(f"{what}: not ready after {timeout_s:.0f} s (last error: {last_error})")


def grpc_serving(target: str, service: str = "") -> Callable[[], bool]:
    def check() -> bool:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2.0)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    return check


def all_of(checks) -> Callable[[], bool]:
    """Every check passes (each replica of a service)."""
    checks = list(checks)
    return lambda: all(check() for check in checks)


def http_ok(url: str, body: str | None = None) -> Callable[[], bool]:
    def check() -> bool:
        reply = httpx.get(url, timeout=2.0)
        return reply.status_code == 200 and (body is None or reply.text.strip() == body)
    return check


def envoy_hosts_healthy(admin_url: str, cluster: str, count: int) -> Callable[[], bool]:
    """Envoy's own health checks pass for `count` hosts of `cluster` (every replica takes traffic,
    not just one: /health is already 200 with one healthy replica)."""
    def check() -> bool:
        text = httpx.get(admin_url + "/clusters", timeout=2.0).text
        healthy = [line for line in text.splitlines()
                   if line.startswith(cluster + "::") and line.endswith("::health_flags::healthy")]
        return len(healthy) == count
    return check


def generate_once(base_url: str, headers: dict[str, str] | None = None) -> Callable[[], bool]:
    """One real request end to end (Envoy → preprocess → generation), one token."""
    def check() -> bool:
        reply = httpx.post(f"{base_url}/v1/generate", timeout=60.0, headers=headers, json={
            "text": "Hello", "model_kwargs": {"sampling": {"max_tokens": 1, "temperature": 0}}})
        if reply.status_code != 200:
            raise NotReady(f"POST /v1/generate -> {reply.status_code} {reply.text[:200]}")
        return True
    return check
