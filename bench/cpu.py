"""CPU-seconds of server processes (and their children) over a measured window, via psutil."""

from __future__ import annotations

import psutil


def _cpu_seconds(pid: int) -> float:
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


class CpuMeter:
    """`with CpuMeter(pids) as m: ...` then m.seconds: user+system seconds the PIDs used inside."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = [p for p in pids if p]
        self.seconds = 0.0
        self._start: dict[int, float] = {}

    def __enter__(self) -> CpuMeter:
        self._start = {p: _cpu_seconds(p) for p in self.pids}
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = sum(_cpu_seconds(p) - s for p, s in self._start.items())
