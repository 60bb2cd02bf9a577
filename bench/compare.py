"""The side-by-side comparison: mstar (through Envoy; its defaults and the numerics variants in
Settings.variants), llama-server and HF generate are all up at once and measured level by level,
in turns, for several rounds. On a shared, noisy box the background load drifts over minutes;
measuring the systems back to back at each level (and taking each one's best round) keeps the
ratios honest where sequential sweeps would compare one system's quiet minute with another's
busy one. Idle systems cost no CPU (llama-server and the engine wait on condition variables, the
HF worker on stdin).

The systems are started one after the other, each timed alone (launch until it serves), so no
start-up is slowed by another's. mstar's defaults are started twice (Settings.cold_start): on an
empty Inductor cache, then warm on the cache that start filled.
Memory: each system's summed process-tree RSS (bench/memory.py) at idle after warm-up, and the
peak sampled during each of its levels."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.clients import GrpcClient, OpenAISSEClient
from bench.loadgen import run_concurrency
from bench.memory import RssSampler, tree_rss_mb
from bench.peers import llama_server
from bench.peers.hf_generate import HFProcess
from bench.prompts import PromptSource
from bench.settings import Settings
from bench.targets import OUT, log, poisson, profile_mstar, sweep, warm


def best_row(rows: list[dict]) -> dict:
    """The round with the highest tok/s, the same rule for every system: other people's work on
    the box only ever slows a measurement down, so the best round is the least disturbed one.
    Every round stays in the JSON (`rounds`)."""
    ok = [r for r in rows if not r.get("errors")] or rows
    row = dict(max(ok, key=lambda r: r["tok_s"]))
    row["rounds_tok_s"] = [round(r["tok_s"], 1) for r in rows]
    row["rounds"] = rows
    return row


def _thread_args(s: Settings) -> list[str]:
    if s.mstar_threads == "auto":
        return []  # the generation service's own default (services/generation/threads.py)
    return ["--threads", str(s.mstar_threads or s.threads)]


def _stack(s: Settings, name: str, dtype: str, quantization: str):
    from services.stack import Stack, StackConfig

    # The load generator is one client: let it use every slot at the top level (fair admission
    # would cap one client at 3/4 of them, 48 of the default 64).
    slots = str(max(64, *s.concurrency))
    config = StackConfig.with_free_ports(model=s.model, log_dir=OUT / "logs" / name, ready_timeout_s=600.0, dtype=dtype,
                                         quantization=quantization, generation_args=_thread_args(s),
                                         preprocess_args=["--max-requests", slots, "--max-requests-per-client", slots])
    return Stack(config)


def _start_stack(stack) -> dict:
    """Start and return the timings (`make run` prints the same `ready`)."""
    stack.start()
    return {k: round(v, 2) for k, v in stack.timings_s.items()}


def _numerics(stack) -> dict:
    """What the stack computes with, as GET /v1/models reports it."""
    try:
        models = httpx.get(stack.http_url + "/v1/models", timeout=10).json()["data"]
        return models[0].get("numerics") or {}
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return {}


@contextlib.contextmanager
def _inductor_cache(path: str):
    """Children started inside inherit TORCHINDUCTOR_CACHE_DIR=path (the generation service keeps
    an inherited one)."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def _start_defaults(s: Settings, up: contextlib.ExitStack) -> tuple[object, dict]:
    """mstar's defaults, started for the measurement. With s.cold_start: first on an empty Inductor
    cache (the compiled step built from scratch), stopped, then started again on the cache that
    start filled: the warm start `make run` promises, whatever the shared cache held before.
    Without: one start on the service's own cache as this box has it ("as found")."""
    if not s.cold_start:
        stack = _stack(s, "mstar", s.dtype, s.quantization)
        up.callback(stack.stop)
        return stack, {"as_found": _start_stack(stack)}
    cache = up.enter_context(tempfile.TemporaryDirectory(prefix="mstar-inductor-"))
    with _inductor_cache(cache):
        cold = _stack(s, "mstar-cold", s.dtype, s.quantization)
        try:
            timings = {"cold": _start_stack(cold)}
        finally:
            cold.stop()
        stack = _stack(s, "mstar", s.dtype, s.quantization)
        up.callback(stack.stop)  # before the cache directory goes: ExitStack unwinds last-in first
        timings["warm"] = _start_stack(stack)
    return stack, timings


def compare(s: Settings, gguf: str) -> dict:
    out: dict = {"mstar": {}, "llama_server": {}, "hf_generate": {}, "mstar_variants": {}}
    with contextlib.ExitStack() as up:
        log("mstar: " + ("a cold start (empty Inductor cache), then a warm one" if s.cold_start else "starting"))
        stack, startup = _start_defaults(s, up)
        kind = "warm" if "warm" in startup else "as_found"
        out["mstar"].update(startup_s=startup[kind]["ready"], startup_kind=kind.replace("_", " "), startup=startup,
                            numerics=_numerics(stack))
        log("mstar ready in " + ", ".join(f"{v['ready']:.1f} s {k.replace('_', ' ')}" for k, v in startup.items()))

        llama = None
        if llama_server.available():
            llama = llama_server.LlamaServer(gguf, threads=s.threads, slots=s.slots)
            up.callback(_stop_llama, llama, out["llama_server"])
            llama.__enter__()
            out["llama_server"]["startup_s"] = llama.startup_s
            log(f"llama-server ready in {llama.startup_s:.1f} s")
        else:
            out["llama_server"]["skipped"] = "not built; run make bench-peers"

        hf = HFProcess(s.prompt_words, s.max_tokens, s.threads, s.model).start()
        up.callback(hf.stop)
        out["hf_generate"].update(hf.wait_ready())
        log(f"HF worker ready in {out['hf_generate']['startup_s']:.1f} s (model load {out['hf_generate']['load_s']:.1f} s)")

        variants = {}
        for v in s.variants:
            if not s.variant_levels(v):
                continue
            log(f"mstar {v['name']}: --dtype {v['dtype']} --quantization {v['quantization']}")
            node = out["mstar_variants"][v["name"]] = {"dtype": v["dtype"], "quantization": v["quantization"],
                                                       "levels": s.variant_levels(v)}
            vs = _stack(s, f"mstar-{v['name']}", v["dtype"], v["quantization"])
            up.callback(vs.stop)
            try:
                timings = _start_stack(vs)
            except Exception as e:  # a variant that cannot start costs its rows, not the comparison
                log(f"mstar {v['name']} did not start: {str(e)[:300]}")
                node["skipped"] = f"did not start: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            variants[v["name"]] = vs
            node.update(startup_s=timings["ready"], startup=timings, numerics=_numerics(vs))
        log(f"all up; rounds {s.rounds}, levels {s.concurrency}")
        asyncio.run(_measure(s, stack, llama, hf, variants, out))
    return out


def _stop_llama(llama, node: dict) -> None:
    llama.__exit__(None, None, None)
    node["version"] = llama_server.version()
    node["argv"] = " ".join(Path(a).name if a.endswith(".gguf") else a for a in llama.argv[1:])


def _pids(stack) -> list[int]:
    return [c.pid for c in stack.children.values()]


def _hf_batch(hf: HFProcess, b: int) -> dict:
    with RssSampler([hf.pid]) as rss:
        row = hf.batch(b)
    return {**row, "rss_peak_mb": rss.peak_mb}


async def _measure(s: Settings, stack, llama, hf: HFProcess, variants: dict, out: dict) -> None:
    mstar_pids = _pids(stack)
    widest = max(s.concurrency)
    http = OpenAISSEClient(stack.http_url, concurrency=widest)
    grpc_client = GrpcClient(stack.grpc_target)
    llama_client = OpenAISSEClient(llama.base_url, concurrency=widest) if llama else None
    variant_clients = {name: OpenAISSEClient(v.http_url, concurrency=widest) for name, v in variants.items()}
    # Each system walks the same prompt sequence, never repeating one (no prefix-cache help).
    src = {name: PromptSource(s.prompt_words) for name in ("mstar", "llama", *variants)}
    try:
        try:
            await warm(http, widest)
            mstar_client, mstar_key = http, "http"
        except RuntimeError as e:  # keep the run: compare over gRPC and say so
            log(f"mstar http unavailable ({e}); using gRPC through Envoy")
            out["mstar"]["http_error"] = str(e)[:300]
            await warm(grpc_client, widest)
            mstar_client, mstar_key = grpc_client, "grpc"
        if llama_client:
            await warm(llama_client, widest)
        for name, client in variant_clients.items():
            await warm(client, max(out["mstar_variants"][name]["levels"]))
        # Idle after warm-up: the KV cache, compiled graphs and first-batch buffers all exist now.
        out["mstar"]["rss_idle_mb"] = tree_rss_mb(mstar_pids)
        out["mstar"]["rss_idle_by_process_mb"] = {name: tree_rss_mb([c.pid]) for name, c in stack.children.items()}
        if llama:
            out["llama_server"]["rss_idle_mb"] = tree_rss_mb([llama.pid])
        out["hf_generate"]["rss_idle_mb"] = tree_rss_mb([hf.pid])
        for name, v in variants.items():
            out["mstar_variants"][name]["rss_idle_mb"] = tree_rss_mb(_pids(v))

        rows: dict[str, dict[int, list[dict]]] = {"mstar": {}, "llama": {}, "hf": {}, **{n: {} for n in variants}}
        loop = asyncio.get_running_loop()
        for rnd in range(s.rounds):
            for c in s.concurrency:
                n = s.requests_at(c)
                r = await run_concurrency(mstar_client, src["mstar"], c, n, s.max_tokens, mstar_pids)
                rows["mstar"].setdefault(c, []).append(r)
                line = f"round {rnd + 1} c={c}: mstar {r['tok_s']:.1f}"
                if llama_client:
                    r = await run_concurrency(llama_client, src["llama"], c, n, s.max_tokens, [llama.pid])
                    rows["llama"].setdefault(c, []).append(r)
                    line += f", llama-server {r['tok_s']:.1f}"
                if c in s.hf_batches:
                    r = await loop.run_in_executor(None, _hf_batch, hf, c)
                    rows["hf"].setdefault(c, []).append(r)
                    line += f", HF {r['tok_s']:.1f}"
                for name, client in variant_clients.items():
                    if c in out["mstar_variants"][name]["levels"]:
                        r = await run_concurrency(client, src[name], c, n, s.max_tokens, _pids(variants[name]))
                        rows[name].setdefault(c, []).append(r)
                        line += f", mstar {name} {r['tok_s']:.1f}"
                log(line + " tok/s")
        out["mstar"][mstar_key] = [best_row(v) for v in rows["mstar"].values()]
        if rows["llama"]:
            out["llama_server"]["http"] = [best_row(v) for v in rows["llama"].values()]
        out["hf_generate"]["rows"] = [best_row(v) for v in rows["hf"].values()]
        for name in variants:
            out["mstar_variants"][name]["http"] = [best_row(v) for v in rows[name].values()]
        # The gRPC sweep, Poisson and the profile below measure the defaults alone: stop the variants.
        for client in variant_clients.values():
            await client.aclose()
        variant_clients.clear()
        for v in variants.values():
            v.stop()
        t0 = time.perf_counter()
        if mstar_key == "http":
            out["mstar"]["grpc"] = await sweep(grpc_client, src["mstar"], s, s.grpc_concurrency, mstar_pids,
                                               "mstar grpc")
        out["mstar"]["poisson"] = await poisson(mstar_client, src["mstar"], s, mstar_pids, f"mstar {mstar_key}")
        if llama_client and s.poisson_peers:
            out["llama_server"]["poisson"] = await poisson(llama_client, src["llama"], s, [llama.pid], "llama-server")
        out["mstar"]["profile"] = await profile_mstar(mstar_client, src["mstar"], s, stack)
        log(f"grpc/poisson/profile took {time.perf_counter() - t0:.0f} s")
    finally:
        for cl in (http, grpc_client, llama_client, *variant_clients.values()):
            if cl is not None:
                await cl.aclose()
