"""Paged attention reference for a batch mixing decode rows and (chunked) prefill rows.

Sequence i owns query rows cu_seqlens_q[i]:cu_seqlens_q[i+1] (q_len_i of them); they are the LAST
q_len_i positions of its context_lens[i] keys, all already in the paged cache. Key n of sequence i
lives at cache[block_tables[i, n // BS], n % BS]. Query row r (0-based within the sequence) sits at
position p = context_len - q_len + r and attends keys 0..p (causal):

    out[t, h] = softmax_n(scale * q[t, h] . k[n, h // G]) @ v[:, h // G],   G = Hq // Hk  (GQA)

Shapes: q [T, Hq, D]; k_cache, v_cache [NB, BS, Hk, D]; block_tables [B, max_blocks] int32;
cu_seqlens_q [B+1] int32; context_lens [B] int32 -> out [T, Hq, D] (rows past cu_seqlens_q[-1]
are zero).

This is the CPU production path, so it leans on scaled_dot_product_attention (fp32 accumulate):
all decode rows go through ONE padded, masked SDPA call; each prefill chunk gets its own call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gather_kv(
    cache: torch.Tensor,  # [NB, BS, Hk, D]
    tables: torch.Tensor,  # [N, nb] block ids (entries past a sequence's last block may be garbage)
) -> torch.Tensor:  # [N, Hk, nb * BS, D]
    n, nb = tables.shape
    ids = tables.clamp(0, cache.shape[0] - 1).long().flatten()  # [N * nb]
    blocks = cache.index_select(0, ids)  # [N * nb, BS, Hk, D]; index_select beats advanced indexing on CPU
    return blocks.view(n, nb * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)


def _attend(q, k, v, mask, scale, is_causal=False):  # q [N, Hq, L, D]; k, v [N, Hk, S, D]
    if q.dtype != k.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1]
    )


def paged_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:  # [T, Hq, D]
    out = torch.zeros_like(q)
    block_size = k_cache.shape[1]
    cu = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    q_lens = [cu[i + 1] - cu[i] for i in range(len(ctx))]

    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        rows = torch.tensor([cu[i] for i in decode], device=q.device)  # [Bd]
        lens = torch.tensor([ctx[i] for i in decode], device=q.device)  # [Bd]
        nb = -(-max(ctx[i] for i in decode) // block_size)
        tables = block_tables[torch.tensor(decode, device=q.device), :nb]  # [Bd, nb]
        k = _gather_kv(k_cache, tables)  # [Bd, Hk, S, D]
        v = _gather_kv(v_cache, tables)
        keys = torch.arange(k.shape[2], device=q.device)  # [S]
        mask = (keys[None, :] < lens[:, None])[:, None, None, :]  # [Bd, 1, 1, S] padding keys off
        qd = q[rows].unsqueeze(2)  # [Bd, Hq, 1, D]
        out[rows] = _attend(qd, k, v, mask, scale).squeeze(2)

    for i, q_len in enumerate(q_lens):
        if q_len <= 1:
            continue
        n_ctx = ctx[i]
        nb = -(-n_ctx // block_size)
        k = _gather_kv(k_cache, block_tables[i : i + 1, :nb])[:, :, :n_ctx]  # [1, Hk, ctx, D]
        v = _gather_kv(v_cache, block_tables[i : i + 1, :nb])[:, :, :n_ctx]
        qi = q[cu[i] : cu[i + 1]].transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
        if q_len == n_ctx:  # a whole prompt: plain causal, the same call HF's sdpa path makes
            oi = _attend(qi, k, v, None, scale, is_causal=True)
        else:  # a later chunk: row r sees keys 0 .. n_ctx - q_len + r
            pos = torch.arange(n_ctx - q_len, n_ctx, device=q.device)  # [q_len]
            mask = torch.arange(n_ctx, device=q.device)[None, :] <= pos[:, None]  # [q_len, ctx]
            oi = _attend(qi, k, v, mask, scale)
        out[cu[i] : cu[i + 1]] = oi.squeeze(0).transpose(0, 1)
    return out
