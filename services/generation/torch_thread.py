"""The one OS thread that runs torch in the generation process: model load, warm-up, engine loop.

torch's OpenMP on Linux is libgomp. libgomp keeps a pool of worker threads for every thread that
has started a parallel region, for as long as that thread lives, and counts the workers of all
pools together; once they outnumber the CPUs, every pool stops spinning between parallel regions
("throttled" waiting: ~1000 spins, then a futex sleep and a wake-up per region). A decode step is a
few hundred short parallel regions, so a second live pool costs the whole step: with the runner
built on an `asyncio.to_thread` worker (which stays alive in the default executor) and the loop on
a thread of its own, a 2-thread step measured 23 ms where the same step on one thread took 8.5 ms;
a tiny parallel op took 60 us instead of 8 (bench/notes.md, "Threads", in docs/benchmarks.md).

So everything that runs torch here is submitted to this single-worker executor, and the engine
loop runs on it too (Engine.start(thread)): one pool, whatever the thread count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class TorchThread:
    def __init__(self, name: str = "engine") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run fn on the torch thread, after whatever was submitted before it."""
        return self._executor.submit(fn, *args)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await fn run on the torch thread (the event loop stays free meanwhile)."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)
