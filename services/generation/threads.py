"""How many torch threads the generation service uses by default: the CPUs this process may use,
minus what the rest of the stack needs.

    usable = min(len(sched_getaffinity(0)), cgroup CPU quota)     (cgroup v2 cpu.max, or v1 cfs quota)
    default = max(1, floor(usable) - reserve),  reserve = floor(usable) // 8

The reserve is what Envoy and the preprocess service (tokenize, detokenize, stream) need next to
the engine when ``make run`` puts all three on one machine: one core in eight (a 32-core server
gets 28 threads, 16 cores 14), none below 8 cores. Measured on the shared 2-core box through the
whole stack (docs/benchmarks.md, 2026-12-01): 2 threads beat 1 at every load, 1.38x at 1 stream
(Envoy and preprocess together used about a tenth of a core there) and 1.6x at 64; the old reserve
of one core was an artefact of a second OpenMP pool throttling every step (torch_thread.py).
``--threads N`` overrides it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def _cgroup_quota(root: Path) -> float | None:
    """CPUs allowed by the cgroup's CFS quota, or None when unlimited or unreadable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # cgroup v2: "max 100000" or "200000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())  # cgroup v1: -1 = unlimited
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float:
    """CPUs this process may run on: the affinity mask, capped by a cgroup quota."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cpus = float(os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup_root)
    return min(cpus, quota) if quota else cpus


def default_threads(usable: float | None = None) -> int:
    usable = usable_cpus() if usable is None else usable
    whole = max(1, math.floor(usable))
    reserve = whole // 8
    return max(1, whole - reserve)
