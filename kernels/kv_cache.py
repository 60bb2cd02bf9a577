"""Paged KV-cache write Triton kernel.

    slot = slot_mapping[t];  if slot >= 0:
        k_cache[slot // BS, slot % BS] = k[t];  v_cache[slot // BS, slot % BS] = v[t]

k, v: [T, Hk, D] (head dim contiguous); k_cache, v_cache: [NB, BS, Hk, D] (any strides, same for
both); slot_mapping: [T] int64, -1 = padding token (skipped). One program per token moves its
[Hk, D] tile for k and v; block * stride is int64 because a large cache passes 2^31 elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch, Target, run, warps_for
from kernels.reference.kv_cache import store_kv_ref

__all__ = ["plan_store_kv", "store_kv", "store_kv_ref"]


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,  # pointers
    n_heads, head_dim, block_size,  # sizes
    stride_kt, stride_kh, stride_vt, stride_vh,  # new k/v strides
    stride_cb, stride_cs, stride_ch, stride_cd,  # cache strides (k_cache and v_cache share them)
    BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr,  # meta
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        block = slot // block_size
        offset = slot % block_size
        heads = tl.arange(0, BLOCK_HEADS)[:, None]
        cols = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < n_heads) & (cols < head_dim)
        dst = block * stride_cb + offset * stride_cs + heads * stride_ch + cols * stride_cd  # int64
        k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + cols, mask=mask)
        v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + cols, mask=mask)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    run(None, plan_store_kv(k, v, k_cache, v_cache, slot_mapping, Target.of(k.device)))


def plan_store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    target: Target,
) -> list[Launch]:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, Hk, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k and v need a contiguous head dim")
    n_tokens, n_heads, head_dim = k.shape
    if k_cache.dim() != 4 or k_cache.shape[2:] != (n_heads, head_dim) or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches must be [NB, BS, {n_heads}, {head_dim}], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share strides")
    if slot_mapping.shape != (n_tokens,) or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64 [{n_tokens}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    if n_tokens == 0:
        return []
    block_heads, block_d = triton.next_power_of_2(n_heads), triton.next_power_of_2(head_dim)
    return [Launch(
        _store_kv_kernel, (n_tokens,),
        (k, v, k_cache, v_cache, slot_mapping.contiguous(), n_heads, head_dim, k_cache.shape[1],
         k.stride(0), k.stride(1), v.stride(0), v.stride(1), *k_cache.stride()),
        dict(BLOCK_HEADS=block_heads, BLOCK_D=block_d), num_warps=warps_for(block_heads * block_d, 8), num_stages=1,
    )]
