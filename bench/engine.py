"""Engine-only decode throughput on the default model vs HF transformers generate(), same weights.

    .venv/bin/python -m bench.engine [--threads 1 2] [--batches 1 4 16] [--new-tokens 32]

For each torch thread count and each number of concurrent sequences B: our engine (driven on this
thread, no gRPC) and HF's batched generate() decode B equal-length prompts greedily with EOS
ignored. Decode tokens/s: ours = tokens / time over the steps in which every sequence decoded one
token; HF = B * (N - 1) / (t(generate N) - t(generate 1)), i.e. prefill subtracted. Writes a
section to docs/benchmarks-engine.md with the machine description.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.sampling_params import SamplingParams
from services.generation.weights.locate import load_checkpoint

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks-engine.md")


def prompts(batch: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, 40000, (length,), generator=g).tolist() for _ in range(batch)]


def ours(runner: ModelRunner, batch: int, prompt_len: int, new_tokens: int) -> float:
    engine = Engine(runner, EngineConfig(num_blocks=runner.config.num_blocks, block_size=runner.config.block_size,
                                         max_num_seqs=64, max_num_batched_tokens=2048), on_step=lambda out: None)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts(batch, prompt_len)):
        engine.add_request(i, p, params)
    num_tokens, seconds = 0, 0.0
    while engine.seqs or not engine._commands.empty():
        t = time.perf_counter()
        out = engine.run_once()
        dt = time.perf_counter() - t
        if out.num_batched_tokens == batch and len(out.tokens) == batch:  # a pure decode step
            num_tokens, seconds = num_tokens + batch, seconds + dt
    return num_tokens / seconds


def hf(model, batch: int, prompt_len: int, new_tokens: int) -> float:
    ids = torch.tensor(prompts(batch, prompt_len))

    def generate(n: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=2, eos_token_id=None)
        return time.perf_counter() - t

    generate(2)  # warm-up
    return batch * (new_tokens - 1) / (generate(new_tokens) - generate(1))


def machine() -> str:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            found = next(line for line in f if line.startswith("flags")).split()
        flags = " ".join(x for x in ("avx", "avx2", "fma", "avx512f", "amx_bf16") if x in found)
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{model}, {os.cpu_count()} cores ({flags}), {mem:.0f} GiB RAM, torch {torch.__version__}, "
            f"Python {platform.python_version()}, fp32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import transformers

    checkpoint = load_checkpoint("default")
    hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**checkpoint.config.to_hf_dict())).eval()
    hf_model.load_state_dict(checkpoint.state_dict, strict=False)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        runner = ModelRunner(checkpoint, RunnerConfig(num_blocks=512, block_size=16, device="cpu", num_threads=threads))
        ours(runner, 2, args.prompt_len, 4)  # warm-up
        for batch in args.batches:
            a = ours(runner, batch, args.prompt_len, args.new_tokens)
            b = hf(hf_model, batch, args.prompt_len, args.new_tokens)
            rows.append((threads, batch, a, b))
            print(f"threads={threads} B={batch}: mstar {a:.1f} tok/s, HF {b:.1f} tok/s, ratio {a / b:.2f}x", flush=True)
    table = ["| torch threads | sequences | mstar decode tok/s | HF generate decode tok/s | ratio |",
             "|---:|---:|---:|---:|---:|"]
    table += [f"| {t} | {b} | {a:.1f} | {h:.1f} | {a / h:.2f}x |" for t, b, a, h in rows]
    section = "\n".join([
        f"## Engine decode throughput ({time.strftime('%Y-%m-%d %H:%M')})", "",
        f"Machine: {machine()}.", "",
        f"Default model (SmolLM2-135M-Instruct, GGUF Q4_1 dequantized to fp32), prompts of {args.prompt_len} "
        f"tokens, {args.new_tokens} greedy tokens, EOS ignored; `python -m bench.engine`.", "",
        *table, "",
    ])
    print(section)
    if not args.no_write:
        with open(DOC, "a") as f:
            f.write(section + "\n")


if __name__ == "__main__":
    main()
