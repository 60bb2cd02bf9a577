"""CPU-seconds of server processes (and their children) over a measured window, via psutil."""

from __future__ import annotations

import psutil


def _cpu_seconds(pid: int, children: bool = True) -> float:
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)] if children else [proc]
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
    """`with CpuMeter(pids) as m: ...` then m.seconds: user+system seconds the PIDs used inside.

    children=False meters the PIDs alone: a client that started the servers it measures must not
    count them as its own."""

    def __init__(self, pids: list[int], children: bool = True) -> None:
        self.pids = [p for p in pids if p]
        self.children = children
        self.seconds = 0.0
        self._start: dict[int, float] = {}

    def __enter__(self) -> CpuMeter:
        self._start = {p: _cpu_seconds(p, self.children) for p in self.pids}
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = sum(_cpu_seconds(p, self.children) - s for p, s in self._start.items())
