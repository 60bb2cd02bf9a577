"""The real rendered Envoy in front of fake_upstream.py (the real HTTP surfaces over a scripted
runner), and the checks of each API's error shape, for the tests in this directory."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

from deploy.envoy.render import VARIANTS
from services.stack import readiness
from services.stack.envoy import start_envoy
from services.stack.ports import free_port
from services.stack.process import Child

HERE = Path(__file__).resolve().parent


def start(tmp: Path, upstream_port: int, wait_healthy: bool, **settings) -> tuple[Child, str]:
    """Envoy with EnvoySettings overrides; ready (and the upstream healthy, if asked)."""
    config = dataclasses.replace(VARIANTS["local"], http_port=free_port(), admin_port=free_port(),
                                 upstream_port=upstream_port, **settings)
    child = start_envoy(config, tmp)
    base = f"http://127.0.0.1:{config.http_port}"
    try:
        readiness.poll("envoy", readiness.http_ok(f"http://127.0.0.1:{config.admin_port}/ready", "LIVE"), 30,
                       alive=child.alive)
        if wait_healthy:
            readiness.poll("upstream", readiness.http_ok(base + "/health"), 30, alive=child.alive)
    except BaseException:
        child.stop(5)
        raise
    return child, base


@contextlib.contextmanager
def in_front_of_fake(tmp: Path, **settings) -> Iterator[str]:
    """Envoy in front of a fake upstream, both stopped at the end; yields Envoy's base URL."""
    port = free_port()
    fake = Child("fake", [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port)], tmp / "fake.log")
    child = None
    try:
        child, base = start(tmp, port, wait_healthy=True, **settings)
        yield base
    finally:
        if child:
            child.stop(5)
        fake.stop(5)


def openai_error(reply, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert not [h for h in reply.headers if h.startswith("grpc-")]
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code", "param"}
    return body["error"]


def anthropic_error(reply, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert not [h for h in reply.headers if h.startswith("grpc-")]
    body = reply.json()
    assert set(body) == {"type", "error"} and body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def native_error(reply, status: int, code: int) -> dict:
    """The google.rpc.Status shape of the native routes (and of paths no API owns)."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["code"] == code and body["message"] and body["details"][0]["domain"], body
    return body
