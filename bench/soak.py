"""Soak test (R20): a bounded stretch of mixed traffic with cancellations against the real stack,
then the leak checks: RSS slope per process, KV blocks at idle vs baseline, error counts.

    python -m bench.soak --minutes 10            # `make soak`; --null-engine for plumbing only

Traffic: `--concurrency` workers through Envoy, each looping: a prompt of a random size (short,
~100 or ~400 tokens), a random max_tokens (1..64), over gRPC GenerateStream (70 %) or HTTP SSE
(30 %); `--cancel` of the requests (default 30 %) are cancelled/disconnected at a random moment.
RSS of generation, preprocess and Envoy is sampled every `--sample-s`; the slope is a least-squares
line over the samples after the first `--warmup` fraction (allocator and caches settling). At the
end the load stops, the engine must drain to nothing running and KV used back to the baseline
taken before the load. Exit status 1 when KV did not return, unexpected errors occurred, or a
slope exceeds `--max-slope-mb-min`. Writes bench/out/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import psutil
from mstar.generation.v1 import generation_service_pb2 as gen_pb2
from mstar.generation.v1 import generation_service_pb2_grpc as gen_grpc
from mstar.v1 import inference_service_pb2 as api
from mstar.v1 import inference_service_pb2_grpc as api_grpc
from mstar.v1 import messages_pb2 as pb

from services.stack import Stack, StackConfig

OUT = Path(__file__).resolve().parent / "out" / "soak.json"
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
MB = 1024 * 1024


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (bounded; default 10)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--cancel", type=float, default=0.30, help="fraction of requests cancelled mid-way")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of samples left out of the slope")
    p.add_argument("--max-slope-mb-min", type=float, default=2.0, help="fail above this RSS growth per process")
    p.add_argument("--null-engine", action="store_true", help="no model: transport and bookkeeping only")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def prompt(rng: random.Random) -> str:
    words = rng.choice([3, 80, 320])  # ~short, ~100, ~400 tokens
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def conductor_status(target: str) -> dict[str, float]:
    async def hold_open():  # a half-close would end the stream before the first status
        yield gen_pb2.StreamRequest()
        await asyncio.sleep(5)

    async with grpc.aio.insecure_channel(target) as channel:
        call = gen_grpc.GenerationServiceStub(channel).Stream(
            hold_open(), metadata=(("mstar-status-interval-ms", "50"),), timeout=5)
        async for response in call:
            for env in response.frames:
                if env.WhichOneof("frame") == "conductor_status":
                    call.cancel()
                    return {m.name: m.value for m in env.conductor_status.metrics}
    raise RuntimeError("no ConductorStatus")


async def wait_idle(target: str, timeout_s: float) -> tuple[dict[str, float], float]:
    t0 = time.monotonic()
    status: dict[str, float] = {}
    while time.monotonic() - t0 < timeout_s:
        status = await conductor_status(target)
        if status["requests_running"] + status["requests_waiting"] == 0:
            return status, time.monotonic() - t0
        await asyncio.sleep(0.2)
    return status, time.monotonic() - t0


class Load:
    def __init__(self, stack: Stack, args: argparse.Namespace):
        self.stack, self.args = stack, args
        self.outcomes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.tokens = 0

    async def grpc_request(self, stub, rng: random.Random, cancel_after: float | None) -> None:
        sampling = pb.SamplingParams(temperature=rng.choice([0.0, 0.8]), max_tokens=rng.choice([1, 8, 32, 64]))
        call = stub.GenerateStream(api.GenerateStreamRequest(
            input=pb.PreprocessInput(text=prompt(rng), model_kwargs=pb.ModelKwargs(sampling=sampling))))
        if cancel_after is not None:
            asyncio.get_running_loop().call_later(cancel_after, call.cancel)
        terminals = 0
        try:
            async for msg in call:
                kind = msg.WhichOneof("event")
                if kind == "complete":
                    terminals += 1
                    self.tokens += msg.complete.usage.completion_tokens
                    self.outcomes["complete"] += 1
                elif kind == "failed":
                    terminals += 1
                    self.errors[f"failed:{msg.failed.reason}"] += 1
        except asyncio.CancelledError:
            if not call.cancelled():
                raise
            self.outcomes["cancelled"] += 1
            return
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and cancel_after is not None:
                self.outcomes["cancelled"] += 1
            else:
                self.errors[f"grpc:{e.code().name}"] += 1
            return
        if terminals != 1:
            self.errors[f"terminal_events:{terminals}"] += 1

    async def http_request(self, client: httpx.AsyncClient, rng: random.Random, cancel_after: float | None) -> None:
        body = {"text": prompt(rng), "model_kwargs": {"sampling": {"max_tokens": rng.choice([1, 8, 32, 64])}}}
        deadline = time.monotonic() + cancel_after if cancel_after is not None else None
        try:
            async with client.stream("POST", "/v1/generate_stream", json=body) as reply:
                if reply.status_code != 200:
                    self.errors[f"http:{reply.status_code}"] += 1
                    return
                async for line in reply.aiter_lines():
                    if deadline is not None and time.monotonic() > deadline:
                        self.outcomes["cancelled"] += 1  # leaving the block disconnects
                        return
                    # The event's oneof name is the first key (`"failed": false` also appears
                    # inside the profile event, so match the frame's start only).
                    if line.startswith('data: {"complete"'):
                        self.outcomes["complete"] += 1
                    elif line.startswith('data: {"failed"'):
                        self.errors["http:failed_event"] += 1
        except httpx.HTTPError as e:
            self.errors[f"http:{type(e).__name__}"] += 1

    async def worker(self, i: int, stop_at: float) -> None:
        rng = random.Random(self.args.seed * 1000 + i)
        async with grpc.aio.insecure_channel(self.stack.grpc_target) as channel, \
                httpx.AsyncClient(base_url=self.stack.http_url, timeout=120) as client:
            stub = api_grpc.InferenceServiceStub(channel)
            while time.monotonic() < stop_at:
                cancel_after = rng.uniform(0.0, 1.5) if rng.random() < self.args.cancel else None
                if rng.random() < 0.7:
                    await self.grpc_request(stub, rng, cancel_after)
                else:
                    await self.http_request(client, rng, cancel_after)


def rss_mb(pids: dict[str, int]) -> dict[str, float]:
    return {name: psutil.Process(pid).memory_info().rss / MB for name, pid in pids.items()}


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 3:
        return 0.0
    xs, ys = [t for t, _ in samples], [v for _, v in samples]
    return statistics.linear_regression(xs, ys).slope * 60.0


async def run(stack: Stack, args: argparse.Namespace) -> dict:
    pids = {name: child.pid for name, child in stack.children.items()}
    baseline_status, _ = await wait_idle(stack.generation_target, 30)
    load = Load(stack, args)
    t0 = time.monotonic()
    stop_at = t0 + args.minutes * 60
    workers = [asyncio.create_task(load.worker(i, stop_at)) for i in range(args.concurrency)]
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
    while time.monotonic() < stop_at:
        for name, value in rss_mb(pids).items():
            samples[name].append((time.monotonic() - t0, value))
        await asyncio.sleep(min(args.sample_s, max(0.0, stop_at - time.monotonic())))
    await asyncio.wait_for(asyncio.gather(*workers), timeout=300)  # each finishes its last request
    idle_status, drain_s = await wait_idle(stack.generation_target, 120)
    skip = int(len(next(iter(samples.values()))) * args.warmup)
    return {
        "minutes": args.minutes, "concurrency": args.concurrency, "cancel_fraction": args.cancel,
        "null_engine": args.null_engine,
        "requests": dict(load.outcomes), "errors": dict(load.errors), "completion_tokens": load.tokens,
        "rss_mb_start": {n: round(s[0][1], 1) for n, s in samples.items() if s},
        "rss_mb_end": {n: round(s[-1][1], 1) for n, s in samples.items() if s},
        "rss_slope_mb_per_min": {n: round(slope_mb_per_min(s[skip:]), 3) for n, s in samples.items()},
        "kv_blocks_used_baseline": baseline_status["kv_blocks_used"],
        "kv_blocks_used_idle": idle_status["kv_blocks_used"],
        "drain_after_load_s": round(drain_s, 2),
        "engine_counters": {k: idle_status[k] for k in ("requests_finished", "requests_failed", "preemptions",
                                                       "generated_tokens", "steps")},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    config = StackConfig.with_free_ports(null_engine=args.null_engine, ready_timeout_s=600.0)
    if args.null_engine:
        config.generation_args = ["--null-step-ms", "20"]
    with Stack(config) as stack:
        print(f"soak: {args.minutes} min, {args.concurrency} workers, {args.cancel:.0%} cancelled; "
              f"logs in {stack.log_dir}", flush=True)
        report = asyncio.run(run(stack, args))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    problems = []
    if report["kv_blocks_used_idle"] > report["kv_blocks_used_baseline"]:
        problems.append("KV blocks not back to baseline")
    if report["errors"]:
        problems.append(f"errors: {report['errors']}")
    steep = {n: s for n, s in report["rss_slope_mb_per_min"].items() if s > args.max_slope_mb_min}
    if steep:
        problems.append(f"RSS growing: {steep} MB/min")
    print("soak: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
