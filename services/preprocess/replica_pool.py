"""Every generation replica one preprocess talks to, and which one each new request goes to.

    pool = ReplicaPool(Resolver("generation:50052"), PoolConfig(...), on_health=..., on_status=...)
    pool.start()                      # resolves, opens one multiplexed stream per replica
    request = pool.submit(...)        # routed, started; what RequestRun reads and appends to
    await pool.close()

- **Membership**: the resolver's answer, re-read every `resolve_interval_s`. A new address gets
  its own GenerationBackend (own stream, reconnect/backoff, health Watch, ConductorStatus). An
  address that disappears is *leaving*: it takes no new request, its running requests finish,
  and it is closed once idle (or it comes back). A replica whose stream breaks reconnects by
  itself and is routed to again as soon as it reports SERVING: no preprocess restart.
- **Routing** (services/preprocess/routing.py): candidates are the replicas that are up and
  SERVING; load = our in-flight requests there + others' from its last ConductorStatus + KV use;
  the prefix index, then rendezvous on the prompt's first full KV blocks, under the load bound.
  The index forgets a replica when it stops serving (restarted replicas start with an empty cache).
- **Failover** (the contract's retry rule): a request lost by its replica (stream broke, or
  RequestFailed UNAVAILABLE: draining, engine failure) before any token came back is re-submitted
  on another SERVING replica it has not tried, at most `max_attempts` times in all, with every
  prompt token received so far; its reader never notices. Others fail with UNAVAILABLE. A replica
  that only went silent (stalled) moves those it can the same way; the others wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from mstar.generation.v1 import generation_service_pb2 as gen_pb2

from services.common.errors import MstarError, unavailable
from services.common.serving import ServingState
from services.preprocess.backend import GenerationBackend
from services.preprocess.backend_request import BackendRequest
from services.preprocess.replica import Replica
from services.preprocess.request import EmbeddingSpec, Sampling
from services.preprocess.resolver import Resolver
from services.preprocess.routing import PrefixIndex, RoutingConfig, choose
from services.preprocess.wire import embedding_kwargs, engine_kwargs

log = logging.getLogger(__name__)

FAILOVER = "failover"  # routing reason of a re-submitted request (metrics)


@dataclass(frozen=True)
class PoolConfig:
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    prefix_index: bool = True  # off: rendezvous + load bound only
    resolve_interval_s: float = 5.0
    heartbeat_s: float = 0.5  # ConductorStatus period asked of every replica (load, and liveness)
    stall_s: float = 5.0  # a replica's stream silent this long is stalled: no new requests go there
    dead_s: float = 60.0  # ... and this long, given up like a broken stream (its requests are lost)
    max_attempts: int = 3  # replicas one request may be tried on (first + failovers)
    queue_size: int = 1024
    connect_timeout_s: float = 2.0
    max_backoff_s: float = 2.0


class RoutingEvents:
    """What the pool reports (no-ops here; services/preprocess/replica_metrics.py counts them)."""

    def routed(self, replica: str, reason: str) -> None: ...
    def failover(self, replica: str, resubmitted: bool) -> None: ...
    def removed(self, replica: str) -> None: ...


class ReplicaPool:
    def __init__(
        self,
        resolver: Resolver,
        config: PoolConfig | None = None,
        *,
        state: ServingState | None = None,
        on_status: Callable[[str, gen_pb2.ConductorStatus], None] | None = None,
        events: RoutingEvents | None = None,
    ) -> None:
        self.resolver = resolver
        self.config = config or PoolConfig()
        self.replicas: dict[str, Replica] = {}
        self.index = PrefixIndex() if self.config.prefix_index else None
        self.events = events or RoutingEvents()
        self._state = state
        self._on_status = on_status
        self._healthy = False
        self._closing = False
        self._task: asyncio.Task | None = None
        self._closing_tasks: set[asyncio.Task] = set()
        self._update_health()  # down until a replica serves

    # ---- what RequestRun uses (and the servicer: health, requests in flight)

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def num_requests(self) -> int:
        return sum(r.in_flight for r in self.replicas.values())

    @property
    def numerics(self) -> dict:
        """How the model is computed (a replica's Stream metadata, for ListModels); a serving
        replica's first, {} until one has connected. Replicas run one model with one configuration."""
        replicas = sorted(self.replicas.values(), key=lambda r: not r.serving)
        return next((r.backend.numerics for r in replicas if r.backend.numerics), {})

    def start(self) -> None:
        self._task = asyncio.create_task(self._maintain(), name="replica-pool")

    async def close(self) -> None:
        self._closing = True  # from here on a lost request fails instead of moving
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(r.backend.close() for r in self.replicas.values()), *self._closing_tasks)

    def submit(
        self, request_id: str, prompt_ids: list[int], sampling: Sampling, max_tokens: int, input_open: bool,
        embedding: EmbeddingSpec | None = None, image_tiles: tuple[bytes, ...] = (),
    ) -> BackendRequest:
        """Route a new request to a replica and start it there; UNAVAILABLE when none serves. With
        `embedding`, a prefill-only request whose result is one TensorResult (sampling unused)."""
        kwargs = embedding_kwargs(embedding) if embedding else engine_kwargs(sampling, max_tokens)
        request = BackendRequest(request_id, prompt_ids, kwargs, input_open, self.config.queue_size, image_tiles)
        if not self._place(request, exclude=()):
            refusal = unavailable("no generation replica is serving", "NO_REPLICA")
            refusal.refused = True  # nothing started: another preprocess replica may have one
            raise refusal
        request.failover = self._failover
        return request

    # ---- routing and failover

    def _place(self, request: BackendRequest, exclude, reason: str | None = None) -> bool:
        candidates = [r for r in self.replicas.values() if r.serving and r.address not in exclude]
        decision = choose(request.prompt_ids, [r.load() for r in candidates], self.config.routing, self.index)
        if decision is None:
            return False
        self.replicas[decision.address].backend.attach(request)
        self.events.routed(decision.address, reason or decision.reason)
        return True

    def _failover(self, request: BackendRequest, error: MstarError, may_stay: bool = False) -> bool:
        """Re-submit `request` elsewhere if the retry rule allows; whether it moved. `may_stay`:
        its replica is only silent, and the request waits there if it cannot move (not a failure)."""
        lost_on = request.tried[-1] if request.tried else ""
        moved = (
            not request.tokens_received  # the contract's retry rule: no ResultTokens row yet
            and not self._closing
            and len(request.tried) < self.config.max_attempts
            and self._place(request, exclude=set(request.tried), reason=FAILOVER)
        )
        if moved or not may_stay:
            self.events.failover(lost_on, moved)
            log.info("request lost by its replica", extra={
                "request_id": request.request_id, "replica": lost_on, "error": error.reason,
                "moved_to": request.tried[-1] if moved else None})
        return moved

    # ---- membership

    async def _maintain(self) -> None:
        while not self._closing:
            try:
                self._apply(await self.resolver.resolve())
            except Exception:  # noqa: BLE001 - a resolver bug must not stop membership updates
                log.exception("replica resolution failed")
            await asyncio.sleep(self.config.resolve_interval_s)

    def _apply(self, addresses: list[str]) -> None:
        wanted = set(addresses)
        for address in addresses:
            replica = self.replicas.get(address)
            if replica is None:
                self._add(address)
            elif replica.leaving:
                log.info("generation replica is back", extra={"replica": address})
                replica.leaving = False
        for replica in list(self.replicas.values()):
            if replica.address not in wanted and not replica.leaving:
                log.info("generation replica left", extra={"replica": replica.address})
                replica.leaving = True
                self._forget(replica)
            if replica.leaving and replica.in_flight == 0:
                del self.replicas[replica.address]
                self.events.removed(replica.address)
                closing = asyncio.create_task(replica.backend.close())
                self._closing_tasks.add(closing)  # a reference until done (asyncio keeps weak ones)
                closing.add_done_callback(self._closing_tasks.discard)
        self._update_health()

    def _add(self, address: str) -> None:
        c = self.config
        holder: list[Replica] = []
        backend = GenerationBackend(
            address, queue_size=c.queue_size, connect_timeout_s=c.connect_timeout_s, max_backoff_s=c.max_backoff_s,
            on_health=lambda ok: self._replica_health(holder[0], ok),
            on_status=lambda status: self._replica_status(holder[0], status),
            heartbeat_s=c.heartbeat_s, stall_s=c.stall_s, dead_s=c.dead_s,
        )
        replica = Replica(address, backend)
        holder.append(replica)
        self.replicas[address] = replica
        log.info("generation replica added", extra={"replica": address})
        backend.start()

    def _replica_health(self, replica: Replica, serving: bool) -> None:
        if not serving:
            self._forget(replica)  # restarted or leaving: its prefix cache is not what we recorded
        self._update_health()

    def _replica_status(self, replica: Replica, status: gen_pb2.ConductorStatus) -> None:
        replica.on_status(status)
        if self._on_status is not None:
            self._on_status(replica.address, status)

    def _forget(self, replica: Replica) -> None:
        replica.forget_status()
        if self.index is not None:
            self.index.forget(replica.address)

    def _update_health(self) -> None:
        """The process's dependency "generation": up while any replica takes requests."""
        self._healthy = any(r.serving for r in self.replicas.values())
        if self._state is None:
            return
        if self._healthy:
            self._state.set_dependency("generation", True)
        elif self.replicas:
            reason, why = next(iter(self.replicas.values())).backend.unhealthy_reason
            self._state.set_dependency("generation", False, reason or "BACKEND_UNAVAILABLE",
                                       why if len(self.replicas) == 1 else f"no generation replica serves ({why})")
        else:
            self._state.set_dependency("generation", False, "NO_REPLICA",
                                       f"{self.resolver.spec} names no generation replica yet")
