"""Asyncio load generator: closed-loop concurrency levels and open-loop Poisson arrivals.
`prompts` is anything with next() -> str (bench.prompts.PromptSource)."""

from __future__ import annotations

import asyncio
import random
import time

from bench.cpu import CpuMeter
from bench.memory import RssSampler
from bench.stats import Record, summarize


async def run_concurrency(client, prompts, concurrency: int, requests: int, max_tokens: int,
                          pids: list[int]) -> dict:
    """`concurrency` workers send requests back to back until `requests` are done. Throughput is
    tokens over the wall time from the first start to the last end."""
    queue = list(range(requests))
    records: list[Record] = []

    async def worker() -> None:
        while queue:
            queue.pop()
            records.append(await client.request(prompts.next(), max_tokens))

    with CpuMeter(pids) as cpu, RssSampler(pids) as rss:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"mode": "concurrency", "concurrency": concurrency, **summarize(records, wall, cpu.seconds),
            **_rss(rss)}


async def run_poisson(client, prompts, rate: float, requests: int, max_tokens: int,
                      pids: list[int], seed: int = 7) -> dict:
    """Requests arrive at exponential intervals (mean 1/rate), whatever the server's state."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        arrivals.append(t)

    async def one(prompt: str, at: float, t0: float) -> Record:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        return await client.request(prompt, max_tokens)

    with CpuMeter(pids) as cpu, RssSampler(pids) as rss:
        t0 = time.perf_counter()
        records = await asyncio.gather(*(one(prompts.next(), at, t0) for at in arrivals))
        wall = time.perf_counter() - t0
    return {"mode": "poisson", "rate_req_s": rate, **summarize(list(records), wall, cpu.seconds), **_rss(rss)}


def _rss(rss: RssSampler) -> dict:
    """The servers' peak summed RSS during the level (none when no PIDs were measured)."""
    return {"rss_peak_mb": rss.peak_mb} if rss.pids else {}


async def warm_up(client, prompt: str, max_tokens: int = 4) -> None:
    rec = await client.request(prompt, max_tokens)
    if rec.error:
        raise RuntimeError(f"warm-up request failed: {rec.error}")
