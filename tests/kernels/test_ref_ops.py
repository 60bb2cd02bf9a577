"""The plain-torch references against Hugging Face transformers' Llama pieces and naive oracles.

The references are the CPU production path, and the engine's greedy output must be token-identical
to HF, so the elementwise ops are held to bit equality in fp32.
"""

from __future__ import annotations

import pytest
import torch
from paged_cases import make_paged_batch, naive_attention
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from kernels.reference import (
    apply_rotary_ref,
    build_cos_sin_cache,
    paged_attention_ref,
    rms_norm_ref,
    silu_and_mul_ref,
    store_kv_ref,
)


@pytest.mark.parametrize("hidden", [1, 37, 576])
def test_rms_norm_ref_is_hf(hidden):
    x, residual, weight = torch.randn(7, hidden), torch.randn(7, hidden), torch.randn(hidden)
    hf = LlamaRMSNorm(hidden, eps=1e-5)
    hf.weight.data.copy_(weight)
    torch.testing.assert_close(rms_norm_ref(x, weight, 1e-5), hf(x), atol=0, rtol=0)
    out, new_residual = rms_norm_ref(x, weight, 1e-5, residual)
    torch.testing.assert_close(new_residual, x + residual, atol=0, rtol=0)
    torch.testing.assert_close(out, hf(x + residual), atol=0, rtol=0)


@pytest.mark.parametrize(("n_q_heads", "n_kv_heads", "head_dim"), [(1, 1, 2), (9, 3, 64), (4, 1, 10)])
def test_rotary_ref_is_hf(n_q_heads, n_kv_heads, head_dim):
    cfg = LlamaConfig(
        hidden_size=n_q_heads * head_dim, num_attention_heads=n_q_heads, num_key_value_heads=n_kv_heads,
        head_dim=head_dim, rope_theta=100000.0, max_position_embeddings=2048,
    )
    positions = torch.tensor([0, 1, 5, 2047, 1000])
    q, k = torch.randn(5, n_q_heads, head_dim), torch.randn(5, n_kv_heads, head_dim)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])  # [1, T, D]
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    cache = build_cos_sin_cache(head_dim, 2048, 100000.0)
    torch.testing.assert_close(cache[positions], torch.cat([cos[0, :, : head_dim // 2], sin[0, :, : head_dim // 2]], -1), atol=0, rtol=0)
    apply_rotary_ref(q, k, positions, cache)
    torch.testing.assert_close(q, q_hf[0].transpose(0, 1), atol=0, rtol=0)
    torch.testing.assert_close(k, k_hf[0].transpose(0, 1), atol=0, rtol=0)


def test_silu_and_mul_ref_is_hf():
    gate, up = torch.randn(5, 67), torch.randn(5, 67)
    torch.testing.assert_close(silu_and_mul_ref(torch.cat([gate, up], -1)), ACT2FN["silu"](gate) * up, atol=0, rtol=0)


def test_store_kv_ref_writes_slots_and_skips_padding():
    k_cache, v_cache = torch.zeros(4, 16, 3, 8), torch.zeros(4, 16, 3, 8)
    k, v = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    store_kv_ref(k, v, k_cache, v_cache, torch.tensor([0, 17, -1, 63]))
    torch.testing.assert_close(k_cache[0, 0], k[0])
    torch.testing.assert_close(k_cache[1, 1], k[1])
    torch.testing.assert_close(v_cache[3, 15], v[3])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 3  # slot -1 wrote nothing


# (context_lens, q_lens): decode rows, a whole prompt, later chunks, a 1-token context.
BATCHES = [
    ([5, 40, 17, 33, 1], [1, 7, 17, 1, 1]),
    ([1], [1]),
    ([64, 3], [64, 2]),
]


@pytest.mark.parametrize(("context_lens", "q_lens"), BATCHES)
@pytest.mark.parametrize(("n_q_heads", "n_kv_heads", "block_size"), [(3, 3, 16), (9, 3, 32), (8, 1, 16)])
def test_paged_attention_ref_is_dense_causal_attention(context_lens, q_lens, n_q_heads, n_kv_heads, block_size):
    batch = make_paged_batch(context_lens, q_lens, n_q_heads, n_kv_heads, 16, block_size)
    # fp32 SDPA vs a float64 oracle: a few fp32 ulps of O(1) outputs.
    torch.testing.assert_close(paged_attention_ref(*batch.args()), naive_attention(batch), atol=1e-5, rtol=1e-5)
