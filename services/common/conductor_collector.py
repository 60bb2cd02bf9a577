"""ConductorStatus snapshots as Prometheus series: the generation service pushes named metrics
on the multiplexed stream; the preprocess renders the latest of each replica at scrape time."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def conductor_metric_name(name: str) -> str:
    """Prometheus name for a ConductorStatus snapshot (`kv_blocks_used` -> mstar_conductor_kv_blocks_used)."""
    name = _INVALID.sub("_", name)
    return "mstar_conductor_" + (name[:-6] if name.endswith("_total") else name)


class ConductorCollector:
    """Keeps the latest ConductorStatus of every generation replica and renders them at scrape
    time, each series labelled with its `replica` (host:port). A custom collector because snapshot
    names are the engine's to choose: nothing here must be declared up front."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[list[tuple[str, bool, float]], float]] = {}

    def update(self, status: Any, replica: str = "") -> None:
        from mstar.generation.v1 import generation_service_pb2

        rows = [
            (conductor_metric_name(m.name), m.kind == generation_service_pb2.METRIC_KIND_COUNTER, m.value)
            for m in status.metrics
        ]
        stamp = status.time.seconds + status.time.nanos / 1e9 if status.HasField("time") else time.time()
        with self._lock:
            self._latest[replica] = (rows, stamp)

    def forget(self, replica: str) -> None:
        """The replica left: its series disappear (bounded cardinality as pods come and go)."""
        with self._lock:
            self._latest.pop(replica, None)

    def describe(self) -> Iterable:
        return []  # unchecked collector: names appear with the first snapshot

    def collect(self) -> Iterable:
        with self._lock:
            latest = dict(self._latest)
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        stamps = GaugeMetricFamily("mstar_conductor_status_time_seconds",
                                   "Unix time of the latest ConductorStatus snapshot.", labels=["replica"])
        for replica, (rows, stamp) in sorted(latest.items()):
            stamps.add_metric([replica], stamp)
            for name, counter, value in rows:
                if name not in families:
                    cls = CounterMetricFamily if counter else GaugeMetricFamily
                    families[name] = cls(name, "Pushed by the generation service in ConductorStatus.",
                                         labels=["replica"])
                families[name].add_metric([replica], value)
        if latest:
            yield stamps
        yield from families.values()
