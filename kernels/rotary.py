"""Rotary position embedding Triton kernel, in place on q and k, HF "rotate_half" layout.

    c, s = cos_sin_cache[positions[t], :D/2], cos_sin_cache[positions[t], D/2:]
    x[t, h, :D/2], x[t, h, D/2:] = x1*c - x2*s, x2*c + x1*s        for x in (q, k)

q: [T, Hq, D], k: [T, Hk, D] (any token/head strides, head dim contiguous; typically views into the
fused qkv projection output); positions: [T] int64 (each < max_pos); cos_sin_cache: [max_pos, D].
One program per token rotates all its q and k heads as one [heads, D/2] tile; c and s are rounded
to the activation dtype first, as HF does, then the math is fp32 with one rounding on store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch, Target, run, warps_for
from kernels.reference.rotary import apply_rotary_ref, build_cos_sin_cache

__all__ = ["apply_rotary", "apply_rotary_ref", "build_cos_sin_cache", "plan_apply_rotary"]


@triton.jit
def _rotate_heads(
    x_ptr, token, stride_t, stride_h, n_heads, half, cos, sin,  # cos, sin: [BLOCK_HALF] fp32
    BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_HEADS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < n_heads) & (cols[None, :] < half)
    ptr1 = x_ptr + token * stride_t + heads[:, None] * stride_h + cols[None, :]  # [BLOCK_HEADS, BLOCK_HALF]
    ptr2 = ptr1 + half
    x1 = tl.load(ptr1, mask=mask, other=0.0)
    x2 = tl.load(ptr2, mask=mask, other=0.0)
    c = cos.to(x1.dtype).to(tl.float32)[None, :]  # HF multiplies by cos/sin in the activation dtype
    s = sin.to(x1.dtype).to(tl.float32)[None, :]
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(ptr1, (x1f * c - x2f * s).to(x1.dtype), mask=mask)
    tl.store(ptr2, (x2f * c + x1f * s).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, positions_ptr, cache_ptr,  # pointers
    n_q_heads, n_k_heads, half,  # sizes
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,  # strides
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,  # meta
):
    token = tl.program_id(0).to(tl.int64)  # int64: token * stride can exceed 2^31
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + cols, mask=cols < half, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, token, stride_qt, stride_qh, n_q_heads, half, cos, sin, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, token, stride_kt, stride_kh, n_k_heads, half, cos, sin, BLOCK_HK, BLOCK_HALF)


def apply_rotary(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hk, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
) -> None:
    run(None, plan_apply_rotary(q, k, positions, cos_sin_cache, Target.of(q.device)))


def plan_apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, target: Target
) -> list[Launch]:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q [T, Hq, D] and k [T, Hk, D] disagree: {tuple(q.shape)} vs {tuple(k.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k need a contiguous head dim")
    n_tokens, n_q_heads, head_dim = q.shape
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache must be [max_pos, {head_dim}] (even D), got {tuple(cos_sin_cache.shape)}")
    if cos_sin_cache.stride(-1) != 1:
        raise ValueError("cos_sin_cache needs a contiguous last dim")
    if positions.shape != (n_tokens,) or positions.dtype != torch.int64:
        raise ValueError(f"positions must be int64 [{n_tokens}], got {positions.dtype} {tuple(positions.shape)}")
    if n_tokens == 0:
        return []
    half = head_dim // 2
    block_hq, block_half = triton.next_power_of_2(n_q_heads), triton.next_power_of_2(half)
    return [Launch(
        _rotary_kernel, (n_tokens,),
        (q, k, positions.contiguous(), cos_sin_cache, n_q_heads, k.shape[1], half,
         q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0)),
        dict(BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(k.shape[1]), BLOCK_HALF=block_half),
        num_warps=warps_for(block_hq * block_half, 8), num_stages=1,
    )]
