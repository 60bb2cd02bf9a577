"""What serving costs: the stack's throughput against the engine alone on the same work, and the
CPU each process spends per streamed token (issue 30, item 1).

    python -m bench.serving_cost [--streams 1,16,64] [--transports http,grpc] [--null-step-ms 0]
    python -m bench.serving_cost --engine-alone --streams 1,16       # the engine alone (one JSON line)

The stack is `make run`'s (Envoy + preprocess + generation, the default model, the generation
service's default threads). Each level is closed-loop: `streams` clients send requests back to
back (bench/loadgen.py: greedy, ignore_eos, `--max-tokens` new tokens, a new 48-word prompt each
time), 4 x streams requests (at least 16). Per process: user+system CPU seconds over the level /
tokens streamed. The client (this process) is counted too: it shares the cores.

The engine alone runs in a fresh process on the same prompts (tokenized as preprocess does), the
same closed loop (a finished request is replaced by the next at once) and the same new-token
count, stepping on the thread that built the runner as the service does; no grpc, no asyncio.
Its throughput is the stack's ceiling on this box: `share` = stack tok/s / engine-alone tok/s.

With --null-step-ms the generation service runs the null engine (services/generation/null_runner.py,
no model) stepping every that many ms: a token source at GPU-like rates, to measure the serving
path alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

from bench.clients import GrpcClient, OpenAISSEClient
from bench.cpu import CpuMeter
from bench.loadgen import run_concurrency, warm_up
from bench.procs import ROOT
from bench.prompts import PromptSource
from bench.run import run_meta

WORDS = 48


def _requests(streams: int) -> int:
    return max(16, 4 * streams)


# ---- the engine alone


def engine_alone(levels: list[int], max_tokens: int) -> dict:
    import torch

    from bench.engine import drain, make_runner, new_engine
    from services.generation.sampling_params import SamplingParams
    from services.generation.threads import default_threads
    from services.generation.weights.locate import load_checkpoint
    from services.preprocess.model import load_model

    threads = default_threads()  # the generation service's own default
    torch.set_num_threads(threads)
    runner = make_runner("default", load_checkpoint("default"), torch.device("cpu"), threads)
    tokenizer = load_model("default").tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    out = {"threads": threads}
    for streams in [1, *levels]:  # the first: a warm-up
        prompts = PromptSource(WORDS)
        engine = new_engine(runner, max(64, streams))
        todo, tokens, key = _requests(streams), 0, 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        for key in range(min(streams, todo)):
            engine.add_request(key, tokenizer.encode(prompts.next()), params)
        key += 1
        for step, _ in drain(engine):  # re-checks for work after every step: the loop below adds some
            tokens += len(step.tokens)
            for _ in step.completed:
                if key < todo:
                    engine.add_request(key, tokenizer.encode(prompts.next()), params)
                    key += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        out[str(streams)] = {"tok_s": tokens / wall, "tokens": tokens, "cpu_ms_per_token": 1e3 * cpu / tokens}
    return out


def _engine_alone_subprocess(levels: list[int], max_tokens: int) -> dict:
    argv = [sys.executable, "-m", "bench.serving_cost", "--engine-alone", "--streams", ",".join(map(str, levels)),
            "--max-tokens", str(max_tokens)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the stack


async def _level(client, streams: int, max_tokens: int, pids: dict[str, int]) -> dict:
    """One closed-loop level (bench/loadgen.py), with each process's CPU metered on its own."""
    meters = {name: CpuMeter([pid], children=name != "client") for name, pid in pids.items()}
    with contextlib.ExitStack() as metering:
        for meter in meters.values():
            metering.enter_context(meter)
        row = await run_concurrency(client, PromptSource(WORDS), streams, _requests(streams), max_tokens, [])
    tokens = max(1, row["output_tokens"])
    row["cpu_ms_per_token"] = {name: 1e3 * m.seconds / tokens for name, m in meters.items()}
    row["cpu_cores"] = {name: m.seconds / row["wall_s"] for name, m in meters.items()}
    return row


def _stack(null_step_ms: float | None, slots: int):
    from services.stack import Stack, StackConfig

    gen_args = ["--null-engine", "--null-step-ms", str(null_step_ms)] if null_step_ms is not None else []
    config = StackConfig.with_free_ports(ready_timeout_s=600.0, generation_args=gen_args,
                                         preprocess_args=["--max-requests", str(slots),
                                                          "--max-requests-per-client", str(slots)])
    return Stack(config)


async def _measure(stack, levels: list[int], transports: list[str], max_tokens: int) -> dict:
    pids = {name: child.pid for name, child in stack.children.items()}
    pids["client"] = os.getpid()
    clients = {"http": OpenAISSEClient(stack.http_url, concurrency=max(levels)), "grpc": GrpcClient(stack.grpc_target)}
    out: dict = {}
    for name in transports:
        await warm_up(clients[name], "Hello there, how are you today?", 8)
    for streams in levels:
        for name in transports:
            out.setdefault(name, {})[str(streams)] = row = await _level(clients[name], streams, max_tokens, pids)
            cpu = ", ".join(f"{k} {v:.3f}" for k, v in row["cpu_ms_per_token"].items())
            print(f"{name} {streams} streams: {row['tok_s']:.1f} tok/s, errors {row['errors']}; CPU-ms/token {cpu}",
                  flush=True)
    await clients["http"].http.aclose()
    await clients["grpc"].aclose()
    return out


# ---- the report

PROCESSES = ("generation", "preprocess", "envoy", "client")



def render(result: dict) -> str:
    """A markdown table per run: tok/s (and the share of the engine alone) and each process's
    CPU-ms per streamed token, every level and transport side by side."""
    alone = result.get("engine_alone", {})
    source = (f"null engine stepping every {result['null_step_ms']:g} ms" if result.get("null_step_ms") is not None
              else "the default model")
    meta = result.get("meta", {})
    title = "with a token source" if result.get("null_step_ms") is not None else "with the real engine"
    lines = [f"## Serving cost per streamed token, {title} (issue 30 item 1; `make bench-serving`)", "",
             f"Measured by `python -m bench.serving_cost` on {meta.get('date', '?')}, commit `{meta.get('commit', '?')}`, "
             f"{meta.get('cpu', '?')}, {meta.get('cores', '?')} cores (load average {meta.get('loadavg', '?')} at start). "
             f"Closed loop, {result['max_tokens']} new tokens a request, {source}; "
             "CPU-ms per streamed token = user+system CPU of the process over the level / tokens streamed.", "",
             "| transport | streams | tok/s | share of engine alone | " + " | ".join(PROCESSES)
             + " | Envoy + preprocess |", "|---|---:|---:|---:|" + "---:|" * (len(PROCESSES) + 1)]
    if alone:
        for streams in map(str, result["levels"]):
            row = alone[streams]
            lines.append(f"| engine alone | {streams} | {row['tok_s']:.0f} | 100 % | {row['cpu_ms_per_token']:.3f} |"
                         " – | – | – | – |")
    for name, rows in result["stack"].items():
        for streams, row in rows.items():
            cpu = row["cpu_ms_per_token"]
            share = f"{100 * row['share_of_engine_alone']:.0f} %" if "share_of_engine_alone" in row else "–"
            cells = " | ".join(f"{cpu[k]:.3f}" for k in PROCESSES)
            lines.append(f"| {name} | {streams} | {row['tok_s']:.0f} | {share} | {cells} | "
                         f"{cpu['envoy'] + cpu['preprocess']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serving_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--transports", default="http,grpc")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--null-step-ms", type=float, help="a token source (the null engine) instead of the model")
    ap.add_argument("--engine-alone", action="store_true", help="only the engine alone; print one JSON line")
    ap.add_argument("--no-engine-alone", action="store_true")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--doc", help="write the table into this markdown doc's serving-cost section "
                                  "(serving-cost-null with --null-step-ms)")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]
    if args.engine_alone:
        print(json.dumps(engine_alone(levels, args.max_tokens)))
        return 0
    result: dict = {"levels": levels, "max_tokens": args.max_tokens, "null_step_ms": args.null_step_ms,
                    "meta": run_meta()}
    if args.null_step_ms is None and not args.no_engine_alone:
        result["engine_alone"] = alone = _engine_alone_subprocess(levels, args.max_tokens)
        print("engine alone: " + ", ".join(f"{k} streams {v['tok_s']:.1f} tok/s ({v['cpu_ms_per_token']:.2f} CPU-ms/token)"
                                           for k, v in alone.items() if k != "threads"), flush=True)
    stack = _stack(args.null_step_ms, max(64, *levels))
    try:
        stack.start()
        result["stack"] = asyncio.run(_measure(stack, levels, args.transports.split(","), args.max_tokens))
    finally:
        stack.stop()
    if "engine_alone" in result:
        for name, rows in result["stack"].items():
            for streams, row in rows.items():
                share = row["tok_s"] / result["engine_alone"][streams]["tok_s"]
                row["share_of_engine_alone"] = share
                print(f"{name} {streams} streams: {100 * share:.0f} % of the engine alone", flush=True)
    if args.doc:
        from pathlib import Path

        from bench import doc_sections

        name = "serving-cost-null" if args.null_step_ms is not None else "serving-cost"
        doc_sections.write(Path(args.doc), name, render(result))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
