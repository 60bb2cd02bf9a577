"""One generation replica as the router sees it: its stream, whether it takes requests, its load.

The load has two parts (services/preprocess/routing.py): what this preprocess has in flight there
now (exact: the stream's open requests) and what everyone else had there at the replica's last
pushed ConductorStatus. The status is dropped when the replica stops serving: a restarted replica
starts empty, and a stale count must not steer requests away from it.
"""

from __future__ import annotations

from mstar.generation.v1 import generation_service_pb2 as gen_pb2

from services.preprocess.backend import GenerationBackend
from services.preprocess.routing import ReplicaLoad, others_from_status


class Replica:
    def __init__(self, address: str, backend: GenerationBackend) -> None:
        self.address = address
        self.backend = backend
        self.leaving = False  # no longer resolved: takes no new request, closes once idle
        self.running = 0  # requests running / waiting / KV use there, all clients, last status
        self.waiting = 0
        self.kv_usage = 0.0
        self._in_flight_then = 0  # our share of running + waiting when that status arrived

    @property
    def serving(self) -> bool:
        """Takes new requests: stream up, health SERVING, still resolved."""
        return self.backend.healthy and not self.leaving

    @property
    def in_flight(self) -> int:
        return self.backend.num_requests

    def on_status(self, status: gen_pb2.ConductorStatus) -> None:
        values = {m.name: m.value for m in status.metrics}
        self.running = int(values.get("requests_running", 0))
        self.waiting = int(values.get("requests_waiting", 0))
        used, free = values.get("kv_blocks_used", 0.0), values.get("kv_blocks_free", 0.0)
        self.kv_usage = used / (used + free) if used + free > 0 else 0.0
        self._in_flight_then = self.in_flight

    def forget_status(self) -> None:
        self.running = self.waiting = self._in_flight_then = 0
        self.kv_usage = 0.0

    def load(self) -> ReplicaLoad:
        others = others_from_status(self.running, self.waiting, self._in_flight_then)
        return ReplicaLoad(self.address, in_flight=self.in_flight, others=others, kv_usage=self.kv_usage)
