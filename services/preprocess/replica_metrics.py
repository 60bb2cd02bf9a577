"""Per-replica routing metrics of one preprocess (docs/metrics.md, "Generation replicas").

Counters are incremented by the ReplicaPool as it routes (`RoutingEvents`); the gauges are read
from the pool at scrape time (the scrape runs in prometheus-client's HTTP thread and only reads
ints and floats the event loop writes, so it needs no lock and never touches the loop). A replica
that leaves the pool takes its series with it, so pod churn does not grow the exposition.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from services.common.conductor_collector import ConductorCollector
from services.preprocess import routing
from services.preprocess.replica_pool import FAILOVER, ReplicaPool, RoutingEvents

REASONS = (routing.PREFIX, routing.AFFINITY, routing.OVERFLOW, routing.LEAST_LOADED, FAILOVER)
OUTCOMES = ("resubmitted", "failed")


class ReplicaMetrics(RoutingEvents):
    def __init__(self, registry: CollectorRegistry, conductor: ConductorCollector | None = None) -> None:
        p = "mstar_preprocess_"
        self.routed_total = Counter(p + "routed_requests", "Requests sent to a generation replica, by the "
                                    "routing rule that chose it.", labelnames=("replica", "reason"), registry=registry)
        self.failovers_total = Counter(p + "replica_failovers", "Requests a replica lost (stream broken, or "
                                       "UNAVAILABLE): resubmitted elsewhere (no token yet), or failed.",
                                       labelnames=("replica", "outcome"), registry=registry)
        self._conductor = conductor
        self._pool: ReplicaPool | None = None
        registry.register(_PoolGauges(self))

    def watch(self, pool: ReplicaPool) -> None:
        self._pool = pool

    def routed(self, replica: str, reason: str) -> None:
        self.routed_total.labels(replica, reason).inc()

    def failover(self, replica: str, resubmitted: bool) -> None:
        self.failovers_total.labels(replica, OUTCOMES[0] if resubmitted else OUTCOMES[1]).inc()

    def removed(self, replica: str) -> None:
        for counter, values in ((self.routed_total, REASONS), (self.failovers_total, OUTCOMES)):
            for value in values:
                try:
                    counter.remove(replica, value)
                except KeyError:
                    pass
        if self._conductor is not None:
            self._conductor.forget(replica)


class _PoolGauges:
    def __init__(self, metrics: ReplicaMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        pool = self._metrics._pool
        p = "mstar_preprocess_replica_"
        serving = GaugeMetricFamily(p + "serving", "1 while the generation replica takes new requests "
                                    "(stream up, health SERVING, still resolved).", labels=["replica"])
        in_flight = GaugeMetricFamily(p + "in_flight", "This preprocess's requests open on the replica.",
                                      labels=["replica"])
        load = GaugeMetricFamily(p + "load", "The router's load figure for the replica (requests: ours now + "
                                 "others' at the last status + kv_weight x KV use).", labels=["replica"])
        kv = GaugeMetricFamily(p + "kv_usage", "KV blocks used / total on the replica, last status (0..1).",
                               labels=["replica"])
        if pool is not None:
            weight = pool.config.routing.kv_weight
            for replica in list(pool.replicas.values()):
                labels = [replica.address]
                serving.add_metric(labels, float(replica.serving))
                in_flight.add_metric(labels, replica.in_flight)
                load.add_metric(labels, replica.load().load(weight))
                kv.add_metric(labels, replica.kv_usage)
        yield from (serving, in_flight, load, kv)
