"""Engine-only throughput on the default model vs HF transformers generate(), same weights.

    .venv/bin/python -m bench.engine [--variants default float32 bfloat16] [--batches 1 4 16 64]
                                     [--threads 1] [--rounds 2] [--profile] [--device cpu|cuda]

Decode (the issue's number): B equal-length prompts, N greedy tokens, EOS ignored. Ours = tokens /
time over the steps in which every sequence decoded one token; HF batched generate() =
B * (N - 1) / (t(generate N) - t(generate 1)), i.e. prefill subtracted: HF's best case, no
padding and every row useful until the end. Per batch size the systems take turns for --rounds
rounds (HF, then each variant) and each reports its best round, so a burst of load from other
processes hits all of them alike; the ratio is against HF fp32 of the same run, by wall clock and
by process CPU time (with one thread the CPU-time ratio is immune to other processes taking the
core, though not to them sharing its caches and memory bandwidth).

Variants (bench/step_profile.py VARIANTS): default = what `make run` serves (a GGUF's own block
codes through kernels/cpu, compiled decode graphs; on CUDA bf16, Triton, CUDA graphs),
default-eager = the same with --step eager, float32 = the exact HF oracle (reference kernels),
bfloat16 = dense bf16. HF runs in fp32 on CPU (the baseline a Python user reaches for) and bf16
on CUDA. --profile adds bench/step_profile.py's per-part table for B = 1 and 16. Optional mixed
workload (--mixed-requests R): R requests with random prompt (16-256) and output (16-128)
lengths, 16 in flight (continuous batching) vs HF's static batches of 16.
Replaces the run of its device in docs/benchmarks-engine.md (the doc's `engine-cpu` or `engine-cuda`
section, bench/doc_sections.py) with this one, machine description included: the doc holds the
latest run, earlier ones live in git history.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from bench import doc_sections
from bench.step_profile import VARIANTS, profile_variant, render
from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.sampling_params import SamplingParams
from services.generation.weights.locate import load_checkpoint

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks-engine.md"
MIXED_CONCURRENCY = 16


def prompts(batch: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, 40000, (length,), generator=g).tolist() for _ in range(batch)]


def mixed_requests(n: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        prompt_len, output_len = int(torch.randint(16, 257, (1,), generator=g)), int(torch.randint(16, 129, (1,), generator=g))
        out.append((torch.randint(100, 40000, (prompt_len,), generator=g).tolist(), output_len))
    return out


def new_engine(runner: ModelRunner, max_num_seqs: int) -> Engine:
    return Engine(runner, EngineConfig(num_blocks=runner.config.num_blocks, block_size=runner.config.block_size,
                                       max_num_seqs=max_num_seqs, max_num_batched_tokens=2048), on_step=lambda out: None)


def clocks() -> torch.Tensor:
    """(wall, process CPU) seconds now. CPU time does not count the moments another process had the
    core, so with one thread its rates compare the two systems' work even on a loaded box."""
    return torch.tensor([time.perf_counter(), time.process_time()], dtype=torch.float64)


def drain(engine: Engine):
    while engine.seqs or not engine._commands.empty():
        t = clocks()
        out = engine.run_once()
        yield out, clocks() - t


def ours_decode(runner: ModelRunner, batch: int, prompt_len: int, new_tokens: int) -> torch.Tensor:
    """Decode tokens per (wall, CPU) second."""
    engine = new_engine(runner, 64)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts(batch, prompt_len)):
        engine.add_request(i, p, params)
    num_tokens, seconds = 0, torch.zeros(2, dtype=torch.float64)
    for out, dt in drain(engine):
        if out.num_batched_tokens == batch and len(out.tokens) == batch:  # a pure decode step
            num_tokens, seconds = num_tokens + batch, seconds + dt
    return num_tokens / seconds


def ours_mixed(runner: ModelRunner, requests: list[tuple[list[int], int]]) -> float:
    engine = new_engine(runner, MIXED_CONCURRENCY)
    t = time.perf_counter()
    for i, (prompt, n) in enumerate(requests):
        engine.add_request(i, prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    produced = sum(len(out.tokens) for out, _ in drain(engine))
    assert produced == sum(n for _, n in requests)
    return produced / (time.perf_counter() - t)  # wall clock only


def hf_generate(model, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    t = clocks()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=2, eos_token_id=None)
    if model.device.type == "cuda":
        torch.cuda.synchronize()  # the last step's kernels may still be queued
    return clocks() - t


def hf_decode(model, batch: int, prompt_len: int, new_tokens: int) -> torch.Tensor:
    """Decode tokens per (wall, CPU) second, prefill subtracted."""
    ids = torch.tensor(prompts(batch, prompt_len), device=model.device)
    mask = torch.ones_like(ids)
    hf_generate(model, ids, mask, 2)  # warm-up
    return batch * (new_tokens - 1) / (hf_generate(model, ids, mask, new_tokens) - hf_generate(model, ids, mask, 1))


def hf_mixed(model, requests: list[tuple[list[int], int]]) -> float:
    seconds = 0.0
    for start in range(0, len(requests), MIXED_CONCURRENCY):
        group = requests[start : start + MIXED_CONCURRENCY]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[2] * (width - len(p)) + p for p, _ in group], device=model.device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group], device=model.device)
        seconds += float(hf_generate(model, ids, mask, max(n for _, n in group))[0])
    return sum(n for _, n in requests) / seconds


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Python {platform.python_version()}"
    model = platform.processor() or "unknown"
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.readlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        found = next(line for line in lines if line.startswith("flags")).split()
        flags = " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if x in found)
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores ({flags}), {mem:.0f} GiB RAM, torch {torch.__version__}, Python {platform.python_version()}"


def make_runner(name: str, checkpoint, device: torch.device, threads: int) -> ModelRunner:
    runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=2048, block_size=16, device=str(device),
                                                  num_threads=threads, max_num_seqs=64, **VARIANTS[name]))
    runner.warm_up()  # compiled graphs, as the service builds them before SERVING
    return runner


def hf_model(checkpoint, device: torch.device, dtype: torch.dtype):
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(checkpoint.config.hf_config()).eval()
    model.load_state_dict(checkpoint.state_dict, strict=False)
    return model.to(device=device, dtype=dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--variants", nargs="+", default=["default", "float32"], choices=list(VARIANTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="turns per batch size; each system's best is kept")
    ap.add_argument("--mixed-requests", type=int, default=0, help="0 skips the mixed workload")
    ap.add_argument("--profile", action="store_true", help="also the per-part step table (B = 1 and 16)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    device = torch.device(args.device)
    checkpoint = load_checkpoint("default")
    hf_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf = hf_model(checkpoint, device, hf_dtype)
    requests = mixed_requests(args.mixed_requests)
    decode, mixed, profiles = [], [], {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        runners = {name: make_runner(name, checkpoint, device, threads) for name in args.variants}
        for name, runner in runners.items():
            ours_decode(runner, 2, args.prompt_len, 4)  # warm-up
            print(f"{name}: {runner.numerics.describe()}; step {runner.step.name}", flush=True)
        for batch in args.batches:
            best: dict[str, torch.Tensor] = {}  # name -> best (wall, CPU) rate over the rounds
            for _ in range(args.rounds):
                rate = hf_decode(hf, batch, args.prompt_len, args.new_tokens)
                best["HF"] = torch.maximum(best.get("HF", rate), rate)
                for name, runner in runners.items():
                    rate = ours_decode(runner, batch, args.prompt_len, args.new_tokens)
                    best[name] = torch.maximum(best.get(name, rate), rate)
            for name in runners:
                ours, base = best[name].tolist(), best["HF"].tolist()
                decode.append((threads, name, batch, ours, base))
                print(f"decode threads={threads} {name} B={batch}: mstar {ours[0]:.1f} tok/s, HF {base[0]:.1f} "
                      f"({ours[0] / base[0]:.2f}x wall, {ours[1] / base[1]:.2f}x CPU time)", flush=True)
        if requests:
            b = hf_mixed(hf, requests)
            for name, runner in runners.items():
                a = ours_mixed(runner, requests)
                mixed.append((threads, name, a, b))
                print(f"mixed threads={threads} {name}: mstar {a:.1f} tok/s, HF {b:.1f}, {a / b:.2f}x", flush=True)
        del runners
        if args.profile and device.type == "cpu":
            for name in args.variants:
                for batch in (1, 16):
                    with torch.inference_mode():
                        profiles[(f"{name}, {threads} thr", batch)] = profile_variant(name, checkpoint, batch, threads, 30)
    section = render_section(args, device, hf_dtype, decode, mixed, profiles)
    print(section)
    if not args.no_write:
        record(DOC, device, section)


def record(doc: Path, device: torch.device, section: str) -> None:
    """Make `section` the doc's latest run on this kind of device: one section per kind
    (`engine-cpu`, `engine-cuda`), so a GPU run does not replace the CPU one."""
    doc_sections.write(doc, f"engine-{device.type}", section.rstrip("\n"))


def render_section(args, device, hf_dtype, decode, mixed, profiles) -> str:
    hf_name = str(hf_dtype).removeprefix("torch.")
    lines = [f"## Engine throughput ({time.strftime('%Y-%m-%d %H:%M')}, {device.type})", "",
             f"Machine: {machine(device)}.", "",
             f"Decode: default model (SmolLM2-135M-Instruct Q4_1 GGUF), {args.batches} sequences x "
             f"{args.prompt_len}-token prompts, {args.new_tokens} greedy tokens, EOS ignored, best of {args.rounds} "
             f"interleaved rounds; `python -m bench.engine " + " ".join(_argv()) + "`.", "",
             f"| threads | mstar variant | sequences | mstar decode tok/s | HF generate {hf_name} tok/s | ratio (wall) "
             "| ratio (CPU time) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for t, name, b, a, h in decode:
        cpu_ratio = f"{a[1] / h[1]:.2f}x" if device.type == "cpu" else "-"
        lines.append(f"| {t} | {name} | {b} | {a[0]:.1f} | {h[0]:.1f} | {a[0] / h[0]:.2f}x | {cpu_ratio} |")
    if mixed:
        lines += ["", f"Mixed workload: {args.mixed_requests} requests, prompts 16-256 and outputs 16-128 tokens "
                  f"(seeded), {MIXED_CONCURRENCY} in flight; useful output tokens / wall time, prefill included.", "",
                  f"| threads | mstar variant | mstar (continuous batching) tok/s | HF {hf_name} (static batches of 16) | ratio |",
                  "|---:|---|---:|---:|---:|"]
        for t, name, a, h in mixed:
            lines.append(f"| {t} | {name} | {a:.1f} | {h:.1f} | {a / h:.2f}x |")
    if profiles:
        lines += ["", "Per decode step, by part (ms, mean of 30 steps; bench/step_profile.py):", "", render(profiles)]
    return "\n".join(lines + [""])


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]


if __name__ == "__main__":
    main()
