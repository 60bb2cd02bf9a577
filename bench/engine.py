"""Engine-only throughput on the default model vs HF transformers generate(), same weights.

    .venv/bin/python -m bench.engine [--threads 1 2] [--variants float32 bfloat16 gguf-q4]
                                     [--batches 1 4 16] [--mixed-requests 64] [--device cpu|cuda]

Two measurements, both in one process, each engine row next to the HF row it is compared with:

1. Decode (the issue's number): B equal-length prompts, N greedy tokens, EOS ignored. Ours =
   tokens / time over the steps in which every sequence decoded one token; HF batched generate() =
   B * (N - 1) / (t(generate N) - t(generate 1)), i.e. prefill subtracted. HF's best case: no
   padding and every row useful until the end.
2. Mixed workload (how vLLM's benchmark_throughput.py compares with HF): R requests with random
   prompt (16-256) and output (16-128) lengths, at most B=16 in flight. Ours: all submitted at once,
   the engine keeps 16 running (continuous batching). HF: consecutive batches of 16, left-padded,
   each generating the batch's longest output (static batching). Useful output tokens / wall time,
   prefill included.

Variants: float32 (the default, token-for-token identical to HF), bfloat16 (--dtype bfloat16) and
gguf-q4 (--quantization gguf: the GGUF's 4-bit weights through torch's int4 matmul, bf16
activations). HF runs in the variant's activation dtype; ratios are also given against HF fp32.
Writes a section to docs/benchmarks-engine.md with the machine description.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import time

import torch

from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import DTYPES, ModelRunner, RunnerConfig
from services.generation.sampling_params import SamplingParams
from services.generation.weights.locate import load_checkpoint

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks-engine.md")
MIXED_CONCURRENCY = 16
# name -> (engine dtype, engine quantization); HF runs in the engine's activation dtype.
VARIANTS = {"float32": ("float32", "none"), "bfloat16": ("bfloat16", "none"), "gguf-q4": ("bfloat16", "gguf")}


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


def drain(engine: Engine):
    while engine.seqs or not engine._commands.empty():
        t = time.perf_counter()
        out = engine.run_once()
        yield out, time.perf_counter() - t


def ours_decode(runner: ModelRunner, batch: int, prompt_len: int, new_tokens: int) -> float:
    engine = new_engine(runner, 64)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts(batch, prompt_len)):
        engine.add_request(i, p, params)
    num_tokens, seconds = 0, 0.0
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
    return produced / (time.perf_counter() - t)


def hf_generate(model, ids: torch.Tensor, mask: torch.Tensor, n: int) -> float:
    t = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=2, eos_token_id=None)
    if model.device.type == "cuda":
        torch.cuda.synchronize()  # the last step's kernels may still be queued
    return time.perf_counter() - t


def hf_decode(model, batch: int, prompt_len: int, new_tokens: int) -> float:
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
        seconds += hf_generate(model, ids, mask, max(n for _, n in group))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--mixed-requests", type=int, default=64, help="0 skips the mixed workload")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import transformers

    device = torch.device(args.device)
    checkpoint = load_checkpoint("default", keep_q4="gguf-q4" in args.variants)
    hf_fp32 = transformers.LlamaForCausalLM(transformers.LlamaConfig(**checkpoint.config.to_hf_dict())).eval()
    hf_fp32.load_state_dict(checkpoint.state_dict, strict=False)
    hf_dtypes = {"float32"} | {VARIANTS[v][0] for v in args.variants}
    hf_models = {name: copy.deepcopy(hf_fp32).to(device=device, dtype=DTYPES[name]) for name in hf_dtypes}
    del hf_fp32
    requests = mixed_requests(args.mixed_requests)
    decode, mixed = [], []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in args.variants:
            dtype, quantization = VARIANTS[name]
            runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=1024, block_size=16, device=str(device),
                                                          num_threads=threads, dtype=dtype, quantization=quantization))
            ours_decode(runner, 2, args.prompt_len, 4)  # warm-up
            for batch in args.batches:
                a = ours_decode(runner, batch, args.prompt_len, args.new_tokens)
                b = hf_decode(hf_models[dtype], batch, args.prompt_len, args.new_tokens)
                decode.append((threads, name, batch, a, b))
                print(f"decode threads={threads} {name} B={batch}: mstar {a:.1f} tok/s, HF {b:.1f}, {a / b:.2f}x", flush=True)
            if requests:
                a, b = ours_mixed(runner, requests), hf_mixed(hf_models[dtype], requests)
                mixed.append((threads, name, a, b))
                print(f"mixed threads={threads} {name}: mstar {a:.1f} tok/s, HF {b:.1f}, {a / b:.2f}x", flush=True)
            del runner
    section = render(args, device, decode, mixed)
    print(section)
    if not args.no_write:
        with open(DOC, "a") as f:
            f.write(section + "\n")


def render(args, device, decode, mixed) -> str:
    hf32 = {(t, b): h for t, name, b, _, h in decode if name == "float32"}
    lines = [f"## Engine throughput ({time.strftime('%Y-%m-%d %H:%M')}, {device.type})", "",
             f"Machine: {machine(device)}.", "",
             f"Decode: default model (SmolLM2-135M-Instruct, GGUF Q4_1 dequantized), {args.batches} sequences x "
             f"{args.prompt_len}-token prompts, {args.new_tokens} greedy tokens, EOS ignored; `python -m bench.engine`.", "",
             "| threads | mstar variant | sequences | mstar decode tok/s | HF generate, same activation dtype | ratio | ratio vs HF fp32 |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for t, name, b, a, h in decode:
        base = hf32.get((t, b))
        lines.append(f"| {t} | {name} | {b} | {a:.1f} | {h:.1f} | {a / h:.2f}x | {f'{a / base:.2f}x' if base else '-'} |")
    if mixed:
        m32 = {t: h for t, name, _, h in mixed if name == "float32"}
        lines += ["", f"Mixed workload: {args.mixed_requests} requests, prompts 16-256 and outputs 16-128 tokens "
                  f"(seeded), {MIXED_CONCURRENCY} in flight; useful output tokens / wall time, prefill included.", "",
                  "| threads | mstar variant | mstar (continuous batching) tok/s | HF (static batches of 16), same activation dtype | ratio | ratio vs HF fp32 |",
                  "|---:|---|---:|---:|---:|---:|"]
        for t, name, a, h in mixed:
            base = m32.get(t)
            lines.append(f"| {t} | {name} | {a:.1f} | {h:.1f} | {a / h:.2f}x | {f'{a / base:.2f}x' if base else '-'} |")
    return "\n".join(lines + [""])


if __name__ == "__main__":
    main()
