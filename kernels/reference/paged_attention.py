"""Paged attention reference for a batch mixing decode rows and (chunked) prefill rows.

Sequence i owns query rows cu_seqlens_q[i]:cu_seqlens_q[i+1] (q_len_i of them); they are the LAST
q_len_i positions of its context_lens[i] keys, all already in the paged cache. Key n of sequence i
lives at cache[block_tables[i, n // BS], n % BS]. Query row r (0-based within the sequence) sits at
position p = context_len - q_len + r and attends keys 0..p (causal), or with a sliding window W > 0
(Mistral, Qwen's windowed layers, Gemma 3's local layers) only the last W of them, p - W < n <= p
(transformers' sliding-window mask):

    out[t, h] = softmax_n(scale * q[t, h] . k[n, h // G]) @ v[:, h // G],   G = Hq // Hk  (GQA)

Shapes: q [T, Hq, D]; k_cache, v_cache [NB, BS, Hk, D]; block_tables [B, max_blocks] int32;
cu_seqlens_q [B+1] int32; context_lens [B] int32 -> out [T, Hq, D] (rows past cu_seqlens_q[-1]
are zero).

The oracle, written to be read: one scaled_dot_product_attention call per sequence over its
gathered keys, the call Hugging Face's sdpa attention makes (a whole prompt: is_causal; a decode
row: no mask), so the fp32 engine stays token-identical to transformers. The serving paths are
kernels/cpu (one fused C++ op) and kernels/paged_attention.py (Triton).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_context(cache: torch.Tensor, table: torch.Tensor, n_keys: int) -> torch.Tensor:
    """One sequence's first n_keys cached vectors: cache [NB, BS, Hk, D], table [max_blocks] -> [Hk, n, D]."""
    block_size = cache.shape[1]
    blocks = table[: -(-n_keys // block_size)].long()  # entries past the last block may be garbage
    return cache[blocks].flatten(0, 1)[:n_keys].transpose(0, 1)


def paged_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
    window: int = 0,  # > 0: a row sees only its last `window` keys
) -> torch.Tensor:  # [T, Hq, D]
    out = torch.zeros_like(q)
    cu, ctx = cu_seqlens_q.tolist(), context_lens.tolist()
    for i, n_ctx in enumerate(ctx):
        q0, q1 = cu[i], cu[i + 1]
        q_len = q1 - q0
        if q_len == 0 or n_ctx == 0:
            continue
        k = gather_context(k_cache, block_tables[i], n_ctx).to(q.dtype)[None]  # [1, Hk, ctx, D]
        v = gather_context(v_cache, block_tables[i], n_ctx).to(q.dtype)[None]
        qi = q[q0:q1].transpose(0, 1)[None]  # [1, Hq, q_len, D]
        mask, causal = None, q_len > 1 and q_len == n_ctx  # a whole prompt: plain causal, like HF
        windowed = 0 < window < n_ctx  # some key falls outside some row's window
        if 1 < q_len < n_ctx or windowed:  # a later chunk: row r sees keys 0 .. n_ctx - q_len + r
            pos = torch.arange(n_ctx - q_len, n_ctx, device=q.device)
            keys = torch.arange(n_ctx, device=q.device)[None, :]
            mask = keys <= pos[:, None]  # [q_len, ctx]
            if windowed:
                mask &= keys > pos[:, None] - window
            causal = False
        oi = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale, is_causal=causal,
                                            enable_gqa=q.shape[1] != k.shape[1])
        out[q0:q1] = oi[0].transpose(0, 1)
    return out
