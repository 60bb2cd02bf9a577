"""The CPU decode step against its floor on this machine (issue 30, item 2).

    python -m bench.cpu_floor [--threads 2] [--steps 96] [--doc docs/benchmarks.md]

A 1-row decode step must read every weight the model serves once (the decoder layers' block codes,
scales and offsets, the LM head, the norms) and its own K/V; nothing else is compulsory. The floor
is those bytes over the read bandwidth this machine gives the same number of threads on a buffer
of the same size (a plain fp32 sum over it, the best of several passes: the same working set,
re-read every pass as the weights are every step, so cache that holds part of it counts as it
does for the step). The step is the median wall time of a 1-row decode on the runner `make run`
serves (warm, compiled or fused as the service builds it), from token 8 on.

Issue 30's goal: step <= 1.4x the floor at 1 row (it was ~2.0x on the Intel box the issue measured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench import doc_sections

SECTION = "cpu-floor"
SKIP_STEPS = 8  # prefill and the first decode steps (allocator, caches) are not the steady step
SINGLE_ROW = ("cos_sin",)  # tables of which a step reads one row, not the whole


def served_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of every distinct tensor storage the model serves, by part (a tied LM head and
    embedding share storage and count once); the tables a step reads one row of are left out."""
    seen: dict[int, tuple[str, int]] = {}
    for name, module in model.named_modules():
        for tname, t in [*module.named_buffers(recurse=False), *module.named_parameters(recurse=False)]:
            if tname in SINGLE_ROW:
                continue
            seen.setdefault(t.untyped_storage().data_ptr(), (f"{name}.{tname}", t.untyped_storage().nbytes()))
    parts: dict[str, int] = {}
    for path, nbytes in seen.values():
        part = "decoder layers" if path.startswith("blocks.") else "LM head (tied embedding)" if path.startswith(("embed.", "lm_head.")) else "norms"
        parts[part] = parts.get(part, 0) + nbytes
    return parts


def kv_bytes_per_token(runner) -> int:
    """K and V of one token over every layer, as the runner's cache stores them."""
    c = runner.model.config
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * runner.kv_cache.k[0].element_size()


def read_bandwidth(nbytes: int, threads: int, passes: int = 15) -> float:
    """Bytes per second a fp32 sum over a buffer of `nbytes` reads with `threads` threads (the best pass)."""
    torch.set_num_threads(threads)
    buffer = torch.ones(nbytes // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def step_ms(runner, steps: int, prompt_len: int = 32) -> tuple[float, int]:
    """Median wall ms of a 1-row decode step, and the context at the median step."""
    from bench.engine import drain, new_engine, prompts
    from services.generation.sampling_params import SamplingParams

    engine = new_engine(runner, 4)
    engine.add_request(0, prompts(1, prompt_len)[0], SamplingParams(temperature=0.0, max_tokens=steps + SKIP_STEPS,
                                                                   ignore_eos=True))
    times = [float(dt[0]) for _, dt in drain(engine)][SKIP_STEPS:]
    return 1e3 * statistics.median(times), prompt_len + SKIP_STEPS + len(times) // 2


def measure(threads: int, steps: int) -> dict:
    from bench.engine import machine, make_runner
    from bench.run import run_meta
    from services.generation.weights.locate import load_checkpoint

    torch.set_num_threads(threads)
    runner = make_runner("default", load_checkpoint("default"), torch.device("cpu"), threads)
    ms, context = step_ms(runner, steps)
    parts = served_bytes(runner.model)
    parts["K/V at the median context"] = kv_bytes_per_token(runner) * context
    total = sum(parts.values())
    bandwidth = read_bandwidth(total, threads)
    floor_ms = 1e3 * total / bandwidth
    return {"meta": run_meta() | {"machine": machine(torch.device("cpu"))}, "threads": threads, "steps": steps,
            "context": context, "bytes": parts, "total_bytes": total, "read_gb_s": bandwidth / 1e9,
            "floor_ms": floor_ms, "step_ms": ms, "ratio": ms / floor_ms,
            "numerics": json.loads(runner.numerics_metadata())}


def render(r: dict) -> str:
    meta = r["meta"]
    rows = "\n".join(f"| {part} | {nbytes / 1e6:.1f} |" for part, nbytes in r["bytes"].items())
    verdict = "met" if r["ratio"] <= 1.4 else "missed"
    return (f"## The CPU step against its floor (issue 30 item 2; `python -m bench.cpu_floor`)\n\n"
            f"Measured on {meta['date']}, commit `{meta['commit']}`, {meta['machine']} (load average "
            f"{meta['loadavg']} at start), {r['threads']} threads, the default model as `make run` serves it "
            f"({r['numerics'].get('weights', '?')}; KV cache {r['numerics'].get('kv_cache', '?')}).\n\n"
            "| what a 1-row step must read | MB |\n|---|---:|\n" + rows
            + f"\n| **total** | **{r['total_bytes'] / 1e6:.1f}** |\n\n"
            f"Read bandwidth at that size, {r['threads']} threads (fp32 sum, best of 15 passes): "
            f"**{r['read_gb_s']:.1f} GB/s** → floor **{r['floor_ms']:.2f} ms**. The 1-row decode step "
            f"(median of {r['steps']}, context ~{r['context']} tokens): **{r['step_ms']:.2f} ms = "
            f"{r['ratio']:.2f}× the floor** (goal ≤ 1.4×: {verdict}).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="default: the generation service's own default")
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--doc", help="write the table into this markdown doc's cpu-floor section")
    args = ap.parse_args(argv)
    from services.generation.threads import default_threads

    result = measure(args.threads or default_threads(), args.steps)
    print(f"step {result['step_ms']:.2f} ms, floor {result['floor_ms']:.2f} ms ({result['total_bytes'] / 1e6:.1f} MB at "
          f"{result['read_gb_s']:.1f} GB/s): {result['ratio']:.2f}x", flush=True)
    doc_sections.save(result, args.json, args.doc, SECTION, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
