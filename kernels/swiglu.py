"""Fused gated-MLP activation Triton kernel: SwiGLU (Llama, Qwen, Mistral) or GeGLU (Gemma).

    SwiGLU  out[t, f] = silu(g) * u = g / (1 + exp(-g)) * u                 g = x[t, f], u = x[t, F + f]
    GeGLU   out[t, f] = gelu_tanh(g) * u = 0.5 g (1 + tanh(c (g + 0.044715 g^3))) * u,  c = sqrt(2 / pi)
            (tanh(y) = 1 - 2 / (1 + exp(2 y)): one exp, and exact at both infinities)

x: [T, 2F] (gate | up, the fused gate_up projection's output; last dim contiguous) -> out [T, F].
Grid (T, cdiv(F, BLOCK)); fp32 math, one rounding on store. Memory bound: 3 * T * F elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch, Target, run
from kernels.reference.swiglu import gelu_tanh_and_mul_ref, silu_and_mul_ref

__all__ = ["gelu_tanh_and_mul", "gelu_tanh_and_mul_ref", "plan_silu_and_mul", "silu_and_mul", "silu_and_mul_ref"]

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr,  # pointers
    F,  # sizes
    stride_x, stride_o,  # row strides
    BLOCK: tl.constexpr, GELU: tl.constexpr,  # meta; GELU: GeGLU instead of SwiGLU
):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can exceed 2^31
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + F + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = 0.5 * gate * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * inner))) * up
    else:
        out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [T, 2F] -> [T, F]
    return run(*plan_silu_and_mul(x, Target.of(x.device)))


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [T, 2F] -> [T, F]
    return run(*plan_silu_and_mul(x, Target.of(x.device), gelu=True))


def plan_silu_and_mul(x: torch.Tensor, target: Target, gelu: bool = False) -> tuple[torch.Tensor, list[Launch]]:
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[1] % 2:
        raise ValueError(f"x must be [T, 2F] with a contiguous last dim, got {tuple(x.shape)} strides {x.stride()}")
    n_rows, width = x.shape
    ffn = width // 2
    out = torch.empty((n_rows, ffn), dtype=x.dtype, device=x.device)  # [T, F]
    if not (n_rows and ffn):
        return out, []
    block = min(_BLOCK, triton.next_power_of_2(ffn))
    launch = Launch(
        _silu_and_mul_kernel, (n_rows, triton.cdiv(ffn, block)), (x, out, ffn, x.stride(0), out.stride(0)),
        dict(BLOCK=block, GELU=gelu), num_warps=4, num_stages=1,
    )
    return out, [launch]
