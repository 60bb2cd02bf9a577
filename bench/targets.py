"""Building blocks of a run (sweeps, Poisson, the profile) and the parts measured on their own:
the transport ceiling and the streamed-input benchmark. The three-way comparison is bench/compare.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from bench import procs
from bench.clients import GrpcClient
from bench.loadgen import run_concurrency, run_poisson
from bench.profile import Sampler
from bench.prompts import PromptSource
from bench.settings import Settings

OUT = procs.ROOT / "bench" / "out"
WARM_SEED = 99


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def warm(client, n: int) -> None:
    # A burst as wide as the sweep's widest level: first-batch allocations happen here, not in a
    # row. Its prompts come from another seed, so the measured prompts are never cached.
    warm = PromptSource(48, seed=WARM_SEED)
    recs = await asyncio.gather(*(client.request(warm.next(), 4) for _ in range(n)))
    errors = [r.error for r in recs if r.error]
    if errors:
        raise RuntimeError(f"warm-up failed: {errors[0]}")


async def sweep(client, prompts, s: Settings, levels: list[int], pids: list[int], label: str,
                requests_at=None) -> list[dict]:
    await warm(client, max(levels))
    rows = []
    for c in levels:
        n = (requests_at or s.requests_at)(c)
        row = await run_concurrency(client, prompts, c, n, s.max_tokens, pids)
        log(f"{label} c={c}: {row['tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_ms']} ms, "
            f"ITL p50 {row['itl_p50_ms']} ms, errors {row['errors']}")
        rows.append(row)
    return rows


async def poisson(client, prompts, s: Settings, pids: list[int], label: str) -> list[dict]:
    rows = []
    for rate in s.poisson_rates:
        row = await run_poisson(client, prompts, rate, s.poisson_requests, s.max_tokens, pids)
        log(f"{label} poisson {rate}/s: {row['tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_ms']} ms, "
            f"p99 {row['ttft_p99_ms']} ms")
        rows.append(row)
    return rows


class FixedPrompt:
    def __init__(self, text: str) -> None:
        self.text = text

    def next(self) -> str:
        return self.text


async def profile_mstar(client, prompts, s: Settings, stack) -> dict:
    """A separate c=16 run with py-spy attached to both services (the measured runs above had
    no sampler attached)."""
    c = max(s.concurrency)
    samplers = {name: Sampler(stack.children[name].pid, s.profile_s, OUT / f"profile-{name}.txt")
                for name in ("generation", "preprocess")}
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < s.profile_s:
        await run_concurrency(client, prompts, c, c, s.max_tokens, [])
    loop = asyncio.get_running_loop()
    return {name: await loop.run_in_executor(None, sp.finish) for name, sp in samplers.items()}


def transport(s: Settings) -> dict:
    """Null-engine stack through Envoy vs the bare grpc.aio ceiling, same client, same run."""
    from services.stack import Stack, StackConfig

    prompts = FixedPrompt("Short prompt for the transport benchmark.")  # null engine: no cache to defeat
    tok = Settings(**{**s.as_dict(), "max_tokens": s.transport_tokens})
    out: dict = {}
    bare = procs.spawn("bare-server", procs.python("bench.bare_server"))
    try:
        port = procs.read_port_line(bare, "bare-server")

        async def go_bare() -> list[dict]:
            client = GrpcClient(f"127.0.0.1:{port}")
            try:
                return await sweep(client, prompts, tok, s.transport_streams, [bare.pid], "bare ceiling",
                                   s.transport_requests_at)
            finally:
                await client.aclose()

        out["bare"] = asyncio.run(go_bare())
    finally:
        procs.stop(bare)
    # One load generator is one client: let it use every slot (fair admission would cap it at 3/4).
    config = StackConfig.with_free_ports(null_engine=True, log_dir=OUT / "logs" / "null", ready_timeout_s=240.0,
                                         preprocess_args=["--max-requests-per-client", "64"])
    log("starting mstar stack with --null-engine")
    with Stack(config) as stack:
        pids = [c.pid for c in stack.children.values()]

        async def go_stack() -> list[dict]:
            client = GrpcClient(stack.grpc_target)
            try:
                return await sweep(client, prompts, tok, s.transport_streams, pids, "null-engine stack",
                                   s.transport_requests_at)
            finally:
                await client.aclose()

        out["stack"] = asyncio.run(go_stack())
    return out


def streamed_input(s: Settings) -> dict:
    script = procs.ROOT / "bench" / "streamed_input.py"
    if not script.exists():
        return {"skipped": "bench/streamed_input.py not present"}
    log("streamed-input benchmark (bench/streamed_input.py)")
    md = OUT / "streamed_input.md"
    out = subprocess.run([sys.executable, str(script), "--trials", str(s.streamed_input_trials), "--out", str(md)],
                         cwd=procs.ROOT, capture_output=True, text=True, timeout=600)
    if out.returncode or not md.exists():
        return {"skipped": f"failed (exit {out.returncode}): {out.stderr[-400:]}"}
    return {"markdown": md.read_text()}
