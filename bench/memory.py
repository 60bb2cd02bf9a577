"""Resident memory of the systems under test (psutil): a system is one or more root PIDs and
every process below them (mstar: Envoy + preprocess + generation; llama-server; the HF worker),
and its memory is the sum of their RSS. A sampler thread records the peak while a level runs.

RSS counts shared pages (the mmapped GGUF, shared libraries) once per process that maps them,
so a sum over processes is an upper bound of what the system pins; the same rule for every peer."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import psutil

MB = 1024 * 1024


def tree_rss_bytes(pids: Iterable[int]) -> int:
    """Summed RSS of each PID and all its descendants; a process reached twice (a PID given along
    with its parent) counts once, a process that is gone counts nothing."""
    rss: dict[int, int] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for proc in tree:
            if proc.pid in rss:
                continue
            try:
                rss[proc.pid] = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return sum(rss.values())


def tree_rss_mb(pids: Iterable[int]) -> float:
    return round(tree_rss_bytes(pids) / MB, 1)


class RssSampler:
    """`with RssSampler(pids) as m: ...` then m.peak_mb: the highest summed tree RSS sampled every
    `interval_s` inside the block (and once at each end, so a short block still has a value)."""

    def __init__(self, pids: Iterable[int], interval_s: float = 0.1) -> None:
        self.pids = [p for p in pids if p]
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    @property
    def peak_mb(self) -> float:
        return round(self.peak_bytes / MB, 1)

    def _sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pids))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> RssSampler:
        if self.pids:
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.pids:
            self._stop.set()
            self._thread.join()
            self._sample()
