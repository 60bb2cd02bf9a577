"""Kernels the AOT gate must reject, for tests/kernels/test_aot_compile.py (never used by the engine).

Both run under the interpreter; the real compiler rejects the first and spills the second.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch

_SCALE: tl.constexpr = 3  # an annotation, not a tl.constexpr instance: the compiler refuses the read


@triton.jit
def _annotated_global_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * _SCALE)


@triton.jit
def _spilling_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    # One warp holds a 64 x 128 fp32 tile live across a row reduction: 256 values per thread.
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    x = tl.load(x_ptr + offs)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    tl.store(out_ptr + offs, x / norm[:, None])


def annotated_global_launch(device: str = "meta") -> tuple[Launch, torch.Tensor, torch.Tensor]:
    x = torch.arange(16, dtype=torch.float32, device=device)
    out = torch.empty_like(x)
    return Launch(_annotated_global_kernel, (1,), (x, out), dict(BLOCK=16), num_warps=4, num_stages=1), x, out


def spilling_launch() -> Launch:
    x = torch.empty(64 * 128, dtype=torch.float32, device="meta")
    return Launch(_spilling_kernel, (1,), (x, torch.empty_like(x)), dict(ROWS=64, COLS=128), num_warps=1, num_stages=1)
