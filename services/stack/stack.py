"""Generation + preprocess + Envoy as one unit: start, wait until a real request works, stop.

    with Stack(StackConfig.with_free_ports()) as stack:   # tests: any free ports
        httpx.post(stack.http_url + "/v1/generate", ...)

`make run` uses the same class (services/stack/__main__.py). Start order: all three children are
launched at once (Envoy and preprocess come up while the model loads); ready means every service
process reports grpc.health SERVING, Envoy's admin /ready is LIVE, Envoy's health checks see
every preprocess replica healthy and one real request through Envoy succeeded. Stop order is the reverse
of the request path: Envoy (no new traffic), preprocess, generation.

Both services serve Prometheus metrics on their own ports (`generation_metrics_port`,
`preprocess_metrics_port`); `restart(name)` starts one child again with the same command line
(services/stack/supervisor.py does that when a child exits).

Replicas (`generation_replicas`, `preprocess_replicas`; `make run`'s --generation-replicas /
--preprocess-replicas): replica i of a service listens on its base port + 2·i, metrics
included (the services' ports interleave: 50051, 50053 ... preprocess; 50052, 50054 ...
generation) and is the child "generation" / "generation-1" / ...; every preprocess gets every
generation replica and its peers, and Envoy balances over every preprocess. Generation replicas
on one machine share its cores: each gets default_threads() // replicas torch threads (at least 1)
unless generation_args name --threads, since OpenMP workers of several processes spinning on the
same cores starve each other (3 replicas x 2 threads on 2 cores timed out the scale-out tests).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from deploy.envoy.render import VARIANTS, EnvoySettings
from services.generation.threads import default_threads
from services.stack import readiness
from services.stack.envoy import start_envoy
from services.stack.ports import free_ports_with_stride
from services.stack.process import Child

REPLICAS = ("generation_replicas", "preprocess_replicas")
PORT_STRIDE = 2  # replica i listens on base + 2·i
PORTS = ("http_port", "admin_port", "preprocess_port", "generation_port", "preprocess_metrics_port",
         "generation_metrics_port")


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
    generation_replicas: int = 1
    preprocess_replicas: int = 1
    generation_model: str | None = None  # what generation loads, when not `model` (tests: a tiny one)
    null_engine: bool = False
    dtype: str = "auto"  # generation --dtype (services/generation/numerics.py)
    quantization: str = "auto"  # generation --quantization: auto = a GGUF's own block codes; none = dense
    log_dir: Path | None = None
    # Where preprocess keeps state (the stored /v1/responses); None = the log directory.
    data_dir: Path | None = None
    # Inputs may name files under this directory (preprocess --file-root); None = no file inputs.
    file_root: Path | None = None
    ready_timeout_s: float = 600.0
    # API keys Envoy requires (MSTAR_API_KEYS, MSTAR_API_KEYS_FILE / --api-keys-file); () = open.
    api_keys: tuple[str, ...] = ()
    generation_args: list[str] = field(default_factory=list)
    preprocess_args: list[str] = field(default_factory=list)
    envoy_overrides: dict[str, object] = field(default_factory=dict)

    @classmethod
    def with_free_ports(cls, **overrides: object) -> StackConfig:
        replicas = max(int(overrides.get(name, 1)) for name in REPLICAS)  # type: ignore[call-overload]
        taken: set[int] = set()
        ports = {name: free_ports_with_stride(replicas, PORT_STRIDE, taken) for name in PORTS}
        return cls(**{**ports, **overrides})  # type: ignore[arg-type]

    def generation_ports(self, base: int | None = None) -> list[int]:
        base = self.generation_port if base is None else base
        return [base + PORT_STRIDE * i for i in range(self.generation_replicas)]

    def preprocess_ports(self, base: int | None = None) -> list[int]:
        base = self.preprocess_port if base is None else base
        return [base + PORT_STRIDE * i for i in range(self.preprocess_replicas)]


def replica_name(service: str, i: int) -> str:
    """The child name of replica i ("generation", "generation-1", ...): replica 0 keeps the plain name."""
    return service if i == 0 else f"{service}-{i}"


def replica_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1]) if "-" in name else 0


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
    def preprocess_targets(self) -> list[str]:
        return [f"{self.config.host}:{port}" for port in self.config.preprocess_ports()]

    @property
    def generation_targets(self) -> list[str]:
        return [f"{self.config.host}:{port}" for port in self.config.generation_ports()]

    @property
    def metrics_urls(self) -> dict[str, str]:
        """/metrics of every process, by child name (Envoy's Prometheus stats under "envoy")."""
        c = self.config
        urls = {replica_name("generation", i): f"http://{c.host}:{port}/metrics"
                for i, port in enumerate(c.generation_ports(c.generation_metrics_port))}
        urls.update({replica_name("preprocess", i): f"http://{c.host}:{port}/metrics"
                     for i, port in enumerate(c.preprocess_ports(c.preprocess_metrics_port))})
        urls["envoy"] = f"{self.admin_url}/stats/prometheus"
        return urls

    def envoy_settings(self, **overrides: object) -> EnvoySettings:
        tracing: dict[str, object] = {}
        if self.config.otlp_endpoint:
            host, _, port = self.config.otlp_endpoint.removeprefix("http://").rpartition(":")
            tracing = {"otlp_host": host, "otlp_port": int(port)}
        keys = {"api_keys": tuple(self.config.api_keys)} if self.config.api_keys else {}
        return replace(VARIANTS["local"], http_port=self.config.http_port, admin_port=self.config.admin_port,
                       upstream_host=self.config.host, upstream_port=self.config.preprocess_port,
                       upstream_ports=tuple(self.config.preprocess_ports()),
                       **{**tracing, **keys, **self.config.envoy_overrides, **overrides})

    # ---- lifecycle
    def start(self) -> Stack:
        t0 = time.monotonic()
        for i in range(self.config.generation_replicas):
            name = replica_name("generation", i)
            self.children[name] = Child(name, self.generation_argv(i), self.log_dir / f"{name}.log")
        for i in range(self.config.preprocess_replicas):
            name = replica_name("preprocess", i)
            self.children[name] = Child(name, self.preprocess_argv(i), self.log_dir / f"{name}.log")
        self.children["envoy"] = start_envoy(self.envoy_settings(), self.log_dir)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        return self

    def generation_argv(self, i: int) -> list[str]:
        c = self.config
        argv = [sys.executable, "-m", "services.generation", "--model", c.generation_model or c.model,
                "--host", c.host, "--port", str(c.generation_ports()[i]),
                "--metrics-port", str(c.generation_ports(c.generation_metrics_port)[i])]
        if c.otlp_endpoint:
            argv += ["--otlp-endpoint", c.otlp_endpoint]
        if c.null_engine:
            argv.append("--null-engine")
        else:
            argv += ["--dtype", c.dtype, "--quantization", c.quantization]
            if c.generation_replicas > 1 and "--threads" not in c.generation_args:
                argv += ["--threads", str(max(1, default_threads() // c.generation_replicas))]
        return argv + c.generation_args

    def preprocess_argv(self, i: int) -> list[str]:
        c = self.config
        port = c.preprocess_ports()[i]
        argv = [sys.executable, "-m", "services.preprocess", "--model", c.model,
                "--generation", ",".join(self.generation_targets), "--host", c.host, "--port", str(port),
                "--metrics-port", str(c.preprocess_ports(c.preprocess_metrics_port)[i]),
                # One data dir for every replica: they share the stored /v1/responses (SQLite, WAL).
                "--data-dir", str(c.data_dir or self.log_dir)]
        if c.preprocess_replicas > 1:
            argv += ["--peers", ",".join(self.preprocess_targets), "--advertise", f"{c.host}:{port}"]
        if c.default_max_tokens is not None:
            argv += ["--default-max-tokens", str(c.default_max_tokens)]
        if c.file_root is not None:
            argv += ["--file-root", str(c.file_root)]
        if c.otlp_endpoint:
            argv += ["--otlp-endpoint", c.otlp_endpoint]
        return argv + c.preprocess_args

    def _alive(self) -> bool:
        return all(child.alive() for child in self.children.values())

    def restart(self, name: str) -> Child:
        """Start child `name` again: same command line, ports, environment and log file."""
        child = self.children[name] = self.children[name].respawn()
        return child

    def ready_check(self, name: str) -> Callable[[], bool]:
        """How child `name` says it serves (after a restart)."""
        if name == "envoy":
            return readiness.http_ok(self.admin_url + "/ready", "LIVE")
        targets = self.generation_targets if name.startswith("generation") else self.preprocess_targets
        return readiness.grpc_serving(targets[replica_index(name)])

    def _wait_ready(self, t0: float) -> None:
        timeout = self.config.ready_timeout_s
        steps = [
            ("envoy", readiness.http_ok(self.admin_url + "/ready", "LIVE")),
            ("generation", readiness.all_of(readiness.grpc_serving(t) for t in self.generation_targets)),
            ("preprocess", readiness.all_of(readiness.grpc_serving(t) for t in self.preprocess_targets)),
            ("envoy_upstream", readiness.envoy_hosts_healthy(self.admin_url, "preprocess", len(self.preprocess_targets))),
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
        for service in ("envoy", "preprocess", "generation"):
            for name in [n for n in self.children if n == service or n.startswith(service + "-")]:
                codes[name] = self.children.pop(name).stop(grace_s)
        return codes

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
