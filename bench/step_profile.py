"""Where one decode step's time goes, by part: python -m bench.step_profile

    python -m bench.step_profile [--variants default default-eager float32] [--batches 1 16]
                                 [--threads 1] [--steps 30] [--json out.json]

B sequences with 32-token prompts decode greedily; after a few warm steps, `--steps` pure decode
steps are measured (wall clock of Engine.run_once, mean per step).

Eager variants: each part is timed around its own call (CPU ops are synchronous): the KernelOps
implementations (rms_norm, apply_rotary, store_kv, paged_attention, the fused attention,
silu_and_mul), the projections and the LM head (F.linear, kernels/cpu quant_matmul and torch's
int4 matmul, told apart by the weight's row count), the sampler. "other model ops" is the rest of
the forward (embedding, gathers, casts), "engine Python" the rest of the step (scheduler, step
tensors, outputs). Compiled variants: a fused graph cannot be split by wrappers, so torch.profiler
reports the opaque C++ ops inside it (quant_matmul, attention), the graph's own time (Inductor's
fused RMSNorm / residual / SiLU x up / casts and its wrapper) and its entry (guards, dispatch).

It only patches names that exist, so it also profiles older checkouts: docs/benchmarks-engine.md's
"before" columns come from `PYTHONPATH=<main worktree> python bench/step_profile.py ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from services.generation.engine import Engine, EngineConfig
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.sampling_params import SamplingParams
from services.generation.weights.locate import load_checkpoint

# name -> RunnerConfig fields (fields an older RunnerConfig lacks are dropped)
VARIANTS = {
    "default": {},  # what `make run` serves: the GGUF's codes, C++ kernels, compiled decode (this branch)
    "default-eager": {"step": "eager"},
    "float32": {"dtype": "float32", "quantization": "none"},  # the HF oracle (reference kernels, eager)
    "bfloat16": {"dtype": "bfloat16", "quantization": "none"},
    "gguf-q4": {"dtype": "bfloat16", "quantization": "gguf"},  # before this branch: torch's int4 matmul
}
KERNEL_PARTS = {"rms_norm": "RMSNorm", "apply_rotary": "RoPE", "store_kv": "KV store", "paged_attention": "attention",
                "attention": "attention (fused RoPE + KV store)", "silu_and_mul": "SiLU x up"}
STACK_PART = "decoder stack (one C++ call: every layer's matmuls, attention, norms)"
ORDER = [STACK_PART, "layer matmuls", "LM head", "attention", "attention (fused RoPE + KV store)", "RoPE", "KV store", "RMSNorm",
         "SiLU x up", "compiled graph: fused elementwise + wrapper", "compiled graph: entry (guards, dispatch)",
         "other model ops", "sampler", "engine Python"]


class PartTimer:
    """Wall time per part; a call made inside a timed call is not counted twice."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth = 0

    def wrap(self, part, fn):
        def timed(*args, **kwargs):
            name = part(*args) if callable(part) else part
            if self._depth or name is None:
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self._depth -= 1

        return timed


def make_runner(name: str, checkpoint, threads: int) -> ModelRunner:
    known = {f.name for f in dataclasses.fields(RunnerConfig)}
    config = {k: v for k, v in VARIANTS[name].items() if k in known}
    return ModelRunner(checkpoint, RunnerConfig(num_blocks=1024, block_size=16, device="cpu", num_threads=threads,
                                                **config))


def _engine(runner: ModelRunner, batch: int) -> Engine:
    engine = Engine(runner, EngineConfig(num_blocks=1024, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048),
                    on_step=lambda out: None)
    g = torch.Generator().manual_seed(0)
    for i in range(batch):
        engine.add_request(i, torch.randint(100, 40000, (32,), generator=g).tolist(),
                           SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True))
    for _ in range(4):  # the prefill step(s), then a few decode steps
        engine.run_once()
    return engine


def _patch_eager(runner: ModelRunner, timer: PartTimer) -> list:
    """Wrap the parts; returns (owner, name, original) triples to undo."""
    vocab = runner.vocab_size
    undo = []

    def patch(owner, name, part):
        original = getattr(owner, name)
        undo.append((owner, name, original))
        setattr(owner, name, timer.wrap(part, original))

    impl = runner.ops._impl
    for key, part in KERNEL_PARTS.items():
        if key in impl:
            original = impl[key]
            undo.append((impl, key, original))
            impl[key] = timer.wrap(part, original)

    head = runner.model.lm_head
    head_storage = getattr(head, "weight", head).untyped_storage().data_ptr() if not hasattr(head, "codes") else None

    def linear_part(x, w, *rest):  # the fp32 head runs in row slices: recognise it by its storage
        return "LM head" if w.untyped_storage().data_ptr() == head_storage else "layer matmuls"

    patch(F, "linear", linear_part)
    if hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        patch(torch, "_weight_int4pack_mm_for_cpu", "layer matmuls")
    try:
        from kernels import cpu
    except ImportError:
        cpu = None
    if cpu is not None and hasattr(cpu, "quant_matmul"):
        patch(cpu, "quant_matmul", lambda x, w: "LM head" if w.rows == vocab else "layer matmuls")
    return undo


def _unpatch(undo: list) -> None:
    for owner, name, original in reversed(undo):
        if isinstance(owner, dict):
            owner[name] = original
        else:
            setattr(owner, name, original)


def _profiled_compiled_parts(engine: Engine, steps: int, vocab: int) -> tuple[dict[str, float], float]:
    """Seconds per part over `steps` steps of a compiled decode, from torch.profiler's self times,
    and the steps' wall time (the profiler's own cost, ~1-2 us per recorded op, included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.run_once()
        total = time.perf_counter() - t0
    parts: dict[str, float] = defaultdict(float)
    for event in prof.events():
        name, self_s = event.name, event.self_cpu_time_total / 1e6
        if name == "mstar_cpu::quant_matmul":
            scale_shape = event.input_shapes[2] if len(event.input_shapes) > 2 else []
            head = bool(scale_shape) and scale_shape[0] * 16 >= vocab
            parts["LM head" if head else "layer matmuls"] += self_s
        elif name == "mstar_cpu::decoder_stack":
            parts[STACK_PART] += self_s
        elif name == "mstar_cpu::attention":
            parts["attention (fused RoPE + KV store)"] += self_s
        elif name.startswith("## Call CompiledFxGraph"):
            parts["compiled graph: fused elementwise + wrapper"] += self_s
        elif name.startswith(("TorchDynamo Cache Lookup", "Torch-Compiled Region", "Pregraph bytecode",
                              "AOTDispatcher")):
            parts["compiled graph: entry (guards, dispatch)"] += self_s
    return parts, total


def profile_variant(name: str, checkpoint, batch: int, threads: int, steps: int) -> dict[str, float]:
    """Milliseconds per decode step, by part, plus "step" (the whole engine step)."""
    runner = make_runner(name, checkpoint, threads)
    if hasattr(runner, "warm_up"):
        runner.warm_up()
    compiled = getattr(runner, "compiled", None) is not None
    engine = _engine(runner, batch)
    timer = PartTimer()
    forward, sampler = runner.forward if hasattr(runner, "forward") else None, runner.sampler
    runner.sampler = timer.wrap("sampler", sampler)
    if forward is not None:
        runner.forward = timer.wrap("forward", forward) if compiled else forward
    undo = [] if compiled else _patch_eager(runner, timer)
    if not compiled:  # the forward is the sum of its parts plus "other model ops"
        model_forward = runner.model.forward
        runner.model.forward = _outer_timer(timer, model_forward)
    if compiled:
        parts, total = _profiled_compiled_parts(engine, steps, runner.vocab_size)
    else:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.run_once()
        parts, total = {}, time.perf_counter() - t0
    _unpatch(undo)
    seconds = dict(timer.seconds) | parts
    forward_s = seconds.pop("forward", 0.0) + seconds.pop("model forward", 0.0)
    inside = sum(v for k, v in seconds.items() if k not in ("sampler",))
    seconds["other model ops"] = max(0.0, forward_s - inside) if forward_s else 0.0
    seconds["engine Python"] = max(0.0, total - forward_s - seconds.get("sampler", 0.0))
    result = {k: 1e3 * v / steps for k, v in seconds.items()}
    result["step"] = 1e3 * total / steps
    return result


def _outer_timer(timer: PartTimer, fn):
    """Time the whole model forward without hiding the parts timed inside it."""

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.seconds["model forward"] += time.perf_counter() - t0

    return timed


def render(results: dict[tuple[str, int], dict[str, float]]) -> str:
    columns = list(results)
    head = "| part | " + " | ".join(f"{v}, B={b}" for v, b in columns) + " |"
    lines = [head, "|---|" + "---:|" * len(columns)]
    for part in ORDER:
        if any(results[c].get(part, 0) >= 0.005 for c in columns):
            lines.append(f"| {part} | " + " | ".join(f"{results[c].get(part, 0):.2f}" for c in columns) + " |")
    lines.append("| **step** | " + " | ".join(f"**{results[c]['step']:.2f}**" for c in columns) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=["default", "default-eager"], choices=list(VARIANTS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        checkpoint = load_checkpoint("default")
        blocks = getattr(checkpoint, "blocks", None)
    except TypeError:
        blocks = None
    if blocks is None and "gguf-q4" in args.variants:  # an older checkout: 4-bit weights only on request
        checkpoint = load_checkpoint("default", keep_q4=True)
    results = {}
    with torch.inference_mode():
        for name in args.variants:
            for batch in args.batches:
                results[(name, batch)] = profile_variant(name, checkpoint, batch, args.threads, args.steps)
                print(f"{name} B={batch}: step {results[(name, batch)]['step']:.2f} ms", flush=True)
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{v}@{b}": r for (v, b), r in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
