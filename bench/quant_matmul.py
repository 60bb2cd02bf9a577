"""The CPU quant_matmul (kernels/cpu/csrc/quant_matmul.cpp) at the default model's shapes, A/B.

    python -m bench.quant_matmul [--rows 1 16] [--threads 2] [--baseline OLD.cpp]

Times torch.ops.mstar_cpu.quant_matmul for one decode step's projections of SmolLM2-135M (30
layers of q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536 as 4-bit codes, and the tied
Q8_0 LM head 49152x576) and reports ms per step and GMAC/s per shape. With --baseline, another
version of quant_matmul.cpp (for example ``git show HEAD~1:kernels/cpu/csrc/quant_matmul.cpp >
/tmp/old.cpp``) is built beside it under its own op namespace and the two are timed interleaved in
one process (best of rounds; these boxes are noisy, so compare the ratio, not across runs). Its
outputs must equal the current kernel's: the check prints the largest difference.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from kernels import cpu

# (K, N, bits, calls per decode step) for the default model: 30 layers, tied Q8_0 head.
SHAPES = [(576, 576, 4, 60), (576, 192, 4, 60), (576, 1536, 4, 60), (1536, 576, 4, 30), (576, 49152, 8, 1)]

_REGISTER = """
#include <ATen/core/Tensor.h>
#include <torch/library.h>
namespace mstar_cpu {
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                        const at::Tensor& offset, int64_t bits, int64_t n);
}
TORCH_LIBRARY(mstar_cpu_baseline, m) {
  m.def("quant_matmul(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, int n) -> Tensor");
}
TORCH_LIBRARY_IMPL(mstar_cpu_baseline, CPU, m) { m.impl("quant_matmul", &mstar_cpu::quant_matmul); }
"""


def _load_baseline(source: Path):
    """Build `source` as torch.ops.mstar_cpu_baseline.quant_matmul (its C++ namespace renamed, so
    its symbols never resolve to the serving library's)."""
    from torch.utils.cpp_extension import load

    build = Path(tempfile.mkdtemp(prefix="mstar-qmm-baseline-"))
    (build / "register.cpp").write_text(_REGISTER)
    load(name="mstar_cpu_baseline", sources=[str(source), str(build / "register.cpp")], build_directory=str(build),
         extra_cflags=["-O3", "-march=native", "-std=c++20", "-fopenmp", "-w", "-Dmstar_cpu=mstar_cpu_baseline"],
         extra_ldflags=["-fopenmp"], is_python_module=False)
    return torch.ops.mstar_cpu_baseline.quant_matmul


def _best(op, args, reps: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            op(*args)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="activation rows (decode batch)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="another quant_matmul.cpp to time against")
    parser.add_argument("--interleave", type=int, default=3, help="A/B rounds per shape")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu.ensure_loaded()
    current = torch.ops.mstar_cpu.quant_matmul
    baseline = _load_baseline(args.baseline) if args.baseline else None
    gen = torch.Generator().manual_seed(0)
    for m in args.rows:
        step_now = step_base = 0.0
        for k, n, bits, calls in SHAPES:
            codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, generator=gen)
            scale = (torch.rand(n, k // 32, generator=gen) * 0.01).half().float()
            offset = (torch.randn(n, k // 32, generator=gen) * 0.01).half().float()
            w = cpu.pack(codes, scale, offset, bits)
            x = torch.randn(m, k, generator=gen)
            call = (x, w.codes, w.scale, w.offset, bits, n)
            reps = max(3, int(2e7 / (k * n * m)))
            t_now, t_base, diff = float("inf"), float("inf"), ""
            for _ in range(args.interleave):
                t_now = min(t_now, _best(current, call, reps))
                if baseline is not None:
                    t_base = min(t_base, _best(baseline, call, reps))
            step_now += t_now * calls
            line = f"rows {m:3d}  {n:5d}x{k:<5d} {bits}-bit: {t_now * 1e3:7.3f} ms  {m * k * n / t_now / 1e9:6.1f} GMAC/s"
            if baseline is not None:
                step_base += t_base * calls
                diff = (current(*call) - baseline(*call)).abs().max().item()
                line += f"  baseline {t_base * 1e3:7.3f} ms  speed-up {t_base / t_now:4.2f}x  max |diff| {diff:.1e}"
            print(line)
        summary = f"rows {m:3d}  one decode step's projections: {step_now * 1e3:.2f} ms"
        if baseline is not None:
            summary += f" (baseline {step_base * 1e3:.2f} ms, {step_base / step_now:.2f}x)"
        print(summary)


if __name__ == "__main__":
    main()
