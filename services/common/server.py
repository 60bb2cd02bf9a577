"""grpc.aio server bootstrap shared by both services: health, reflection, size limits, signals.

Usage:
    server = GrpcServer("generation", host, port, max_message_bytes=...)
    server.add(pb2_grpc.add_FooServicer_to_server, servicer, "mstar.v1.FooService")
    port = await server.start()          # health NOT_SERVING: server.state is STARTING
    ...                                  # load / warm up
    server.state.serve()
    await server.wait_for_shutdown(grace_s, on_drain=...)   # returns after SIGTERM/SIGINT drain

Health follows `server.state` (services/common/serving.py) and nothing else: "" and every added
service report SERVING exactly when the state is ready; the `liveness` name reports NOT_SERVING
only when the state is FAILED (for liveness probes, which must not restart a process that only
waits for its backend).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.interceptors import ServerInterceptor
from services.common.serving import LIVENESS, ServingState

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# GenerationService.Stream (preprocess -> generation): a request's image tiles travel in its start
# frame as uint8 (768 KiB per 512-pixel tile), so that stream allows more: 80 tiles, four full
# SmolVLM images, fit (services/preprocess/prompt.py caps a request's tiles below it).
INTERNAL_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Options for both servers and channels: explicit size limits and keepalive that tolerates
    long silent prefills (pings every 20 s, never more often than every 10 s)."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class GrpcServer:
    def __init__(
        self,
        service: str,
        host: str,
        port: int,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        interceptors: list[grpc.aio.ServerInterceptor] | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.server = grpc.aio.server(
            options=channel_options(max_message_bytes)
            + [("grpc.so_reuseport", 0)],
            # Ours last: tracing/metrics interceptors passed in see the status it settles on.
            interceptors=[*(interceptors or []), ServerInterceptor()],
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names: list[str] = []
        self.port: int | None = None
        self.state = ServingState(service)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()

    def add(self, add_to_server: Callable[[Any, grpc.aio.Server], None], servicer: Any, service_name: str) -> None:
        add_to_server(servicer, self.server)
        self.service_names.append(service_name)

    async def start(self) -> int:
        names = [*self.service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        self.port = self.server.add_insecure_port(f"{self.host}:{self.requested_port}")
        if self.port == 0:
            raise OSError(f"could not bind {self.host}:{self.requested_port}")
        await self.server.start()
        self._loop = asyncio.get_running_loop()
        await self._sync_health()
        self.state.on_change(self._on_state_change)
        log.info("listening", extra={"host": self.host, "port": self.port, "services": self.service_names})
        return self.port

    def _on_state_change(self, _state: ServingState) -> None:
        # Any thread (the engine's, the watchdog's): health is set on the loop, from the state as
        # it is when the update runs, so updates can never apply out of order.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._sync_health()))

    async def _sync_health(self) -> None:
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        ready = serving if self.state.is_ready else not_serving
        for name in ["", *self.service_names]:
            await self.health.set(name, ready)
        await self.health.set(LIVENESS, serving if self.state.is_live else not_serving)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)

    def request_stop(self) -> None:
        self._stopping.set()

    async def wait_for_shutdown(
        self, grace_s: float, on_drain: Callable[[float], Awaitable[None]] | None = None
    ) -> None:
        """Block until SIGTERM/SIGINT (or request_stop), then drain: report NOT_SERVING, let
        `on_drain(grace_s)` finish or abort in-flight work, and stop the server."""
        self.install_signal_handlers()
        await self._stopping.wait()
        log.info("draining", extra={"grace_s": grace_s})
        self.state.drain()
        await self._sync_health()
        if on_drain is not None:
            await on_drain(grace_s)
        await self.server.stop(grace=1.0)
        log.info("stopped")
