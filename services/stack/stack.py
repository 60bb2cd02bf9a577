"""Generation + preprocess + Envoy as one unit: start, wait until a real request works, stop.

    with Stack(StackConfig.with_free_ports()) as stack:   # tests: any free ports
        httpx.post(stack.http_url + "/v1/generate", ...)

`make run` uses the same class (services/stack/__main__.py). Start order: all three children are
launched at once (Envoy and preprocess come up while the model loads); ready means both services
report grpc.health SERVING, Envoy's admin /ready is LIVE, Envoy's health check sees preprocess
healthy (GET /health) and one real request through Envoy succeeded. Stop order is the reverse
of the request path: Envoy (no new traffic), preprocess, generation.

Both services serve Prometheus metrics on their own ports (`generation_metrics_port`,
`preprocess_metrics_port`); `restart(name)` starts one child again with the same command line
(services/stack/supervisor.py does that when a child exits).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from deploy.envoy.render import VARIANTS, EnvoySettings
from services.stack import readiness
from services.stack.envoy import start_envoy
from services.stack.ports import free_port
from services.stack.process import Child

ENV_PORTS = {
    "http_port": "MSTAR_HTTP_PORT",
    "admin_port": "MSTAR_ADMIN_PORT",
    "preprocess_port": "MSTAR_PREPROCESS_PORT",
    "generation_port": "MSTAR_GENERATION_PORT",
    "preprocess_metrics_port": "MSTAR_PREPROCESS_METRICS_PORT",
    "generation_metrics_port": "MSTAR_GENERATION_METRICS_PORT",
}


@dataclass
class StackConfig:
    model: str = "default"
    host: str = "127.0.0.1"
    http_port: int = 8080
    admin_port: int = 9901
    preprocess_port: int = 50051
    generation_port: int = 50052
    preprocess_metrics_port: int = 9102
    generation_metrics_port: int = 9101
    # max_tokens of a request that sets none (preprocess --default-max-tokens); None = what fits.
    default_max_tokens: int | None = None
    # OpenTelemetry collector (OTLP/gRPC, HOST:PORT) for the spans of Envoy and both services; none = no export.
    otlp_endpoint: str | None = None
    null_engine: bool = False
    dtype: str = "auto"  # generation --dtype: auto = fp32 on CPU (HF parity), bf16 on CUDA
    quantization: str = "none"  # generation --quantization: gguf = the GGUF's 4-bit weights as they are
    log_dir: Path | None = None
    ready_timeout_s: float = 600.0
    generation_args: list[str] = field(default_factory=list)
    preprocess_args: list[str] = field(default_factory=list)
    envoy_overrides: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_env(cls, **overrides: object) -> StackConfig:
        values: dict[str, object] = {k: int(os.environ[v]) for k, v in ENV_PORTS.items() if os.environ.get(v)}
        if os.environ.get("MSTAR_MODEL"):
            values["model"] = os.environ["MSTAR_MODEL"]
        if os.environ.get("MSTAR_DTYPE"):
            values["dtype"] = os.environ["MSTAR_DTYPE"]
        if os.environ.get("MSTAR_QUANTIZATION"):
            values["quantization"] = os.environ["MSTAR_QUANTIZATION"]
        if os.environ.get("MSTAR_DEFAULT_MAX_TOKENS"):
            values["default_max_tokens"] = int(os.environ["MSTAR_DEFAULT_MAX_TOKENS"])
        if os.environ.get("MSTAR_OTLP_ENDPOINT"):
            values["otlp_endpoint"] = os.environ["MSTAR_OTLP_ENDPOINT"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def with_free_ports(cls, **overrides: object) -> StackConfig:
        ports = {name: free_port() for name in ENV_PORTS}
        return cls(**{**ports, **overrides})  # type: ignore[arg-type]


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="mstar-stack-"))
        self.children: dict[str, Child] = {}
        self.timings_s: dict[str, float] = {}

    # ---- addresses
    @property
    def http_url(self) -> str:
        return f"http://{self.config.host}:{self.config.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.config.host}:{self.config.http_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.config.admin_port}"

    @property
    def preprocess_target(self) -> str:
        return f"{self.config.host}:{self.config.preprocess_port}"

    @property
    def generation_target(self) -> str:
        return f"{self.config.host}:{self.config.generation_port}"

    @property
    def metrics_urls(self) -> dict[str, str]:
        c = self.config
        return {"generation": f"http://{c.host}:{c.generation_metrics_port}/metrics",
                "preprocess": f"http://{c.host}:{c.preprocess_metrics_port}/metrics",
                "envoy": f"{self.admin_url}/stats/prometheus"}

    def envoy_settings(self, **overrides: object) -> EnvoySettings:
        tracing: dict[str, object] = {}
        if self.config.otlp_endpoint:
            host, _, port = self.config.otlp_endpoint.removeprefix("http://").rpartition(":")
            tracing = {"otlp_host": host, "otlp_port": int(port)}
        return replace(VARIANTS["local"], http_port=self.config.http_port, admin_port=self.config.admin_port,
                       upstream_host=self.config.host, upstream_port=self.config.preprocess_port,
                       **{**tracing, **self.config.envoy_overrides, **overrides})

    # ---- lifecycle
    def start(self) -> Stack:
        c = self.config
        t0 = time.monotonic()
        py = sys.executable
        gen_argv = [py, "-m", "services.generation", "--model", c.model, "--host", c.host,
                    "--port", str(c.generation_port), "--metrics-port", str(c.generation_metrics_port)]
        otlp = ["--otlp-endpoint", c.otlp_endpoint] if c.otlp_endpoint else []
        gen_argv += otlp
        if c.null_engine:
            gen_argv.append("--null-engine")
        else:
            gen_argv += ["--dtype", c.dtype, "--quantization", c.quantization]
        self.children["generation"] = Child("generation", gen_argv + c.generation_args,
                                            self.log_dir / "generation.log")
        pre_argv = [py, "-m", "services.preprocess", "--model", c.model, "--generation", self.generation_target,
                    "--host", c.host, "--port", str(c.preprocess_port),
                    "--metrics-port", str(c.preprocess_metrics_port)]
        if c.default_max_tokens is not None:
            pre_argv += ["--default-max-tokens", str(c.default_max_tokens)]
        pre_argv += otlp
        self.children["preprocess"] = Child("preprocess", pre_argv + c.preprocess_args,
                                            self.log_dir / "preprocess.log")
        self.children["envoy"] = start_envoy(self.envoy_settings(), self.log_dir)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        return self

    def _alive(self) -> bool:
        return all(child.alive() for child in self.children.values())

    def restart(self, name: str) -> Child:
        """Start child `name` again: same command line, ports, environment and log file."""
        child = self.children[name] = self.children[name].respawn()
        return child

    def ready_check(self, name: str) -> Callable[[], bool]:
        """How child `name` says it serves (after a restart)."""
        return {
            "generation": readiness.grpc_serving(self.generation_target),
            "preprocess": readiness.grpc_serving(self.preprocess_target),
            "envoy": readiness.http_ok(self.admin_url + "/ready", "LIVE"),
        }[name]

    def _wait_ready(self, t0: float) -> None:
        timeout = self.config.ready_timeout_s
        steps = [
            ("envoy", readiness.http_ok(self.admin_url + "/ready", "LIVE")),
            ("generation", readiness.grpc_serving(self.generation_target)),
            ("preprocess", readiness.grpc_serving(self.preprocess_target)),
            ("envoy_upstream", readiness.http_ok(self.http_url + "/health")),
            ("first_request", readiness.generate_once(self.http_url, self._auth_headers())),
        ]
        for name, check in steps:
            remaining = max(1.0, timeout - (time.monotonic() - t0))
            try:
                readiness.poll(name, check, remaining, alive=self._alive)
            except readiness.NotReady as exc:
                raise readiness.NotReady(f"{exc}\n{self.describe_failure()}") from None
            self.timings_s[name] = time.monotonic() - t0
        self.timings_s["ready"] = time.monotonic() - t0

    def _auth_headers(self) -> dict[str, str]:
        keys = self.envoy_settings().api_keys
        return {"authorization": f"Bearer {keys[0]}"} if keys else {}

    def describe_failure(self) -> str:
        parts = []
        for name, child in self.children.items():
            state = "running" if child.alive() else f"exited {child.proc.returncode}"
            parts.append(f"--- {name} ({state}), {child.log_path}:\n{child.log_tail()}")
        return "\n".join(parts)

    def stop(self, grace_s: float = 10.0) -> dict[str, int | None]:
        codes = {}
        for name in ("envoy", "preprocess", "generation"):
            child = self.children.pop(name, None)
            if child is not None:
                codes[name] = child.stop(grace_s)
        return codes

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
