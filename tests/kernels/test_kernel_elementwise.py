"""Triton rms_norm, rotary, silu_and_mul, gelu_tanh_and_mul and store_kv against their torch references.

Runs under the interpreter on CPU (marker `interpreter`) and natively on CUDA (marker `gpu`): the
`triton_ops` fixture parametrises every test over both targets.
"""

from __future__ import annotations

import pytest
import torch

from kernels.reference import (
    apply_rotary_ref,
    build_cos_sin_cache,
    gelu_tanh_and_mul_ref,
    rms_norm_ref,
    silu_and_mul_ref,
    store_kv_ref,
)

# (dtype, atol, rtol) with the reason for each tolerance.
TOLERANCES = [
    # fp32: the kernel sums x^2 in a different order (tree vs torch's vectorised sum): a few ulps.
    pytest.param(torch.float32, 1e-5, 1e-5, id="fp32"),
    # bf16: one ulp is 2^-7 relative (7.8e-3). The kernel does fp32 math and rounds once where torch
    # rounds after each op, and the interpreter's bf16 cast differs from torch's round-to-nearest
    # by 1 ulp on some elements, so allow 2 ulps; atol covers results that cancel to near zero.
    pytest.param(torch.bfloat16, 2e-2, 1.6e-2, id="bf16"),
]


@pytest.mark.parametrize(("dtype", "atol", "rtol"), TOLERANCES)
@pytest.mark.parametrize(("n_rows", "hidden"), [(1, 1), (7, 37), (3, 576)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(triton_ops, dtype, atol, rtol, n_rows, hidden, with_residual):
    dev = triton_ops.device
    x = torch.randn(n_rows, hidden + 3, device=dev).to(dtype)[:, :hidden]  # strided rows
    weight = torch.randn(hidden, device=dev).to(dtype)
    residual = torch.randn(n_rows, hidden, device=dev).to(dtype) if with_residual else None
    got = triton_ops.rms_norm(x, weight, 1e-6, residual)
    want = rms_norm_ref(x, weight, 1e-6, residual)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), TOLERANCES)
@pytest.mark.parametrize(("n_tokens", "ffn"), [(1, 1), (5, 67), (2, 1031)])  # 1031 > one 1024 block
def test_silu_and_mul(triton_ops, dtype, atol, rtol, n_tokens, ffn):
    x = torch.randn(n_tokens, 2 * ffn, device=triton_ops.device).to(dtype)
    torch.testing.assert_close(triton_ops.silu_and_mul(x), silu_and_mul_ref(x), atol=atol, rtol=rtol)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), TOLERANCES)
@pytest.mark.parametrize(("n_tokens", "ffn"), [(1, 1), (5, 67), (2, 1031)])
def test_gelu_tanh_and_mul(triton_ops, dtype, atol, rtol, n_tokens, ffn):
    # gates out to +-12: the tanh (written with one exp) saturates at both ends without overflow to NaN
    x = 4 * torch.randn(n_tokens, 2 * ffn, device=triton_ops.device).to(dtype)
    torch.testing.assert_close(triton_ops.gelu_tanh_and_mul(x), gelu_tanh_and_mul_ref(x), atol=atol, rtol=rtol)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), TOLERANCES)
@pytest.mark.parametrize(
    ("n_tokens", "n_q_heads", "n_kv_heads", "head_dim"), [(1, 1, 1, 2), (5, 9, 3, 64), (3, 5, 1, 10), (4, 8, 8, 128)]
)
def test_apply_rotary_on_fused_qkv_views(triton_ops, dtype, atol, rtol, n_tokens, n_q_heads, n_kv_heads, head_dim):
    dev = triton_ops.device
    cache = build_cos_sin_cache(head_dim, 4096, 10000.0, device=dev)
    positions = torch.randint(0, 4096, (n_tokens,), device=dev)
    qkv = torch.randn(n_tokens, (n_q_heads + 2 * n_kv_heads) * head_dim, device=dev).to(dtype)
    q = qkv[:, : n_q_heads * head_dim].view(n_tokens, n_q_heads, head_dim)  # strided views, like the model
    k = qkv[:, n_q_heads * head_dim : (n_q_heads + n_kv_heads) * head_dim].view(n_tokens, n_kv_heads, head_dim)
    v_before = qkv[:, (n_q_heads + n_kv_heads) * head_dim :].clone()
    q_ref, k_ref = q.clone(), k.clone()
    apply_rotary_ref(q_ref, k_ref, positions, cache)
    triton_ops.apply_rotary(q, k, positions, cache)
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(qkv[:, (n_q_heads + n_kv_heads) * head_dim :], v_before, atol=0, rtol=0)  # v untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block_size", "n_kv_heads", "head_dim"), [(16, 1, 8), (32, 3, 24), (16, 8, 64)])
def test_store_kv_is_an_exact_copy(triton_ops, dtype, block_size, n_kv_heads, head_dim):
    dev = triton_ops.device
    n_blocks, n_tokens = 5, 11
    slots = torch.randperm(n_blocks * block_size)[:n_tokens].to(dev)
    slots[[2, 7]] = -1  # padding tokens
    k = torch.randn(n_tokens, n_kv_heads, head_dim, device=dev).to(dtype)
    v = torch.randn(n_tokens, n_kv_heads, head_dim, device=dev).to(dtype)
    caches = [torch.randn(n_blocks, block_size, n_kv_heads, head_dim, device=dev).to(dtype) for _ in range(2)]
    caches_ref = [c.clone() for c in caches]
    triton_ops.store_kv(k, v, *caches, slots)
    store_kv_ref(k, v, *caches_ref, slots)
    for got, want in zip(caches, caches_ref, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)  # a copy: bit exact


def test_store_kv_past_int32_offsets(triton_ops):
    """A slot whose element offset block * stride exceeds 2^31 lands where it should.

    k and v caches are two halves of ONE uint8 storage of ~2.1 GB: torch.empty only reserves
    address space and the interpreter's copy-back of a CPU storage is a no-op, so the resident
    memory stays ~0.3 GB.
    """
    dev = triton_ops.device
    block_size, n_kv_heads, head_dim = 16, 1, 8
    stride_block = block_size * n_kv_heads * 2 * head_dim
    n_blocks = 2**31 // stride_block + 4
    both = torch.empty(n_blocks, block_size, n_kv_heads, 2 * head_dim, dtype=torch.uint8, device=dev)
    k_cache, v_cache = both[..., :head_dim], both[..., head_dim:]
    last, second_last = (n_blocks - 1) * block_size + 3, (n_blocks - 2) * block_size + 15
    assert (n_blocks - 1) * stride_block > 2**31
    slots = torch.tensor([5, last, -1, second_last], device=dev)
    k = torch.randint(0, 256, (4, n_kv_heads, head_dim), dtype=torch.uint8, device=dev)
    v = torch.randint(0, 256, (4, n_kv_heads, head_dim), dtype=torch.uint8, device=dev)
    triton_ops.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache[0, 5], k[0]) and torch.equal(v_cache[0, 5], v[0])
    assert torch.equal(k_cache[n_blocks - 1, 3], k[1]) and torch.equal(v_cache[n_blocks - 1, 3], v[1])
    assert torch.equal(k_cache[n_blocks - 2, 15], k[3]) and torch.equal(v_cache[n_blocks - 2, 15], v[3])
