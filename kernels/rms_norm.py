"""RMSNorm Triton kernel, optionally fused with the residual add.

    new_residual = x + residual                                 (rounded to x.dtype, as HF does)
    out = weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype),    h = new_residual in fp32

x, residual: [T, H] (rows may be strided, the last dim must be contiguous); weight: [H].
One program per row; the whole row fits one block (BLOCK_H = next_pow2(H), H <= 65536), so the row
is read once and written once: memory bound at 2 (or 4 with the residual) * T * H elements. Warps
grow with the row so that a thread holds at most 16 elements (no spills; the AOT gate checks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch, Target, run, warps_for
from kernels.reference.rms_norm import rms_norm_ref

__all__ = ["plan_rms_norm", "rms_norm", "rms_norm_ref"]

_MAX_H = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,  # pointers
    H, eps,  # sizes
    stride_x, stride_r, stride_o, stride_nr,  # row strides
    HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr,  # meta
):
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can exceed 2^31
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_nr + cols, x, mask=mask)
    h = x.to(tl.float32)
    variance = tl.sum(h * h, axis=0) / H
    normed = (h * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty)  # HF rounds before the weight
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    return run(*plan_rms_norm(x, weight, eps, residual, Target.of(x.device)))


def plan_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None, target: Target
) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], list[Launch]]:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [T, H] with a contiguous last dim, got {tuple(x.shape)} strides {x.stride()}")
    n_rows, hidden = x.shape
    if weight.shape != (hidden,) or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [{hidden}], got {tuple(weight.shape)}")
    if hidden > _MAX_H:
        raise ValueError(f"hidden size {hidden} exceeds the single-block limit {_MAX_H}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1 or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x {tuple(x.shape)} {x.dtype} with a contiguous last dim")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # [T, H]
    new_residual = torch.empty_like(out) if residual is not None else out  # [T, H]
    result = out if residual is None else (out, new_residual)
    if not n_rows:
        return result, []
    res = residual if residual is not None else x  # unused when HAS_RESIDUAL is False
    block_h = triton.next_power_of_2(hidden)
    launch = Launch(
        _rms_norm_kernel, (n_rows,),
        (x, res, weight, out, new_residual, hidden, eps, x.stride(0), res.stride(0), out.stride(0), new_residual.stride(0)),
        dict(HAS_RESIDUAL=residual is not None, BLOCK_H=block_h),
        num_warps=warps_for(block_h, 16), num_stages=1,
    )
    return result, [launch]
