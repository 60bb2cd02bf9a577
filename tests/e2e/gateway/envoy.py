"""The gateway Envoy (gateway.yaml.tmpl) as a child process on free ports.

    gateway = Gateway.start(picker.port, workdir)   # ready: admin /ready is LIVE
    httpx.post(gateway.http_url + "/v1/chat/completions", ...)
    gateway.stop()

The binary and the process handling are the stack's own (services/stack/envoy.py, process.py):
a separate Envoy with its own base id, so it runs beside the pods' Envoys.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

from services.stack import readiness
from services.stack.envoy import envoy_binary
from services.stack.ports import free_port
from services.stack.process import Child

TEMPLATE = Path(__file__).resolve().parent / "gateway.yaml.tmpl"


def render(path: Path, http_port: int, admin_port: int, picker_port: int) -> Path:
    text = string.Template(TEMPLATE.read_text()).substitute(
        http_port=http_port, admin_port=admin_port, picker_port=picker_port)
    path.write_text(text)
    return path


@dataclass
class Gateway:
    child: Child
    http_port: int
    admin_port: int

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @classmethod
    def start(cls, picker_port: int, workdir: Path, timeout_s: float = 30.0) -> Gateway:
        http_port, admin_port = free_port(), free_port()
        config = render(workdir / "gateway.yaml", http_port, admin_port, picker_port)
        child = Child("gateway", [envoy_binary(), "-c", str(config), "--use-dynamic-base-id",
                                  "--log-level", "warning"], workdir / "gateway.log")
        gateway = cls(child, http_port, admin_port)
        try:
            readiness.poll("gateway envoy", readiness.http_ok(gateway.admin_url + "/ready", "LIVE"),
                           timeout_s, alive=child.alive)
        except readiness.NotReady as exc:
            child.stop(0)
            raise readiness.NotReady(f"{exc}\n{child.log_tail()}") from None
        return gateway

    def stop(self) -> int | None:
        return self.child.stop(5)
