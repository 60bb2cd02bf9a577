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
all decode rows go through ONE padded, masked SDPA call; each prefill chunk gets its own call. The
indices and masks depend only on the step's metadata, so they are built once per step (_plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.reference.step_memo import per_step


def _block_ids(tables: torch.Tensor, num_blocks: int) -> torch.Tensor:  # [N, nb] -> [N, nb] int64
    return tables.clamp(0, num_blocks - 1).long()  # entries past a sequence's last block may be garbage


def _gather_kv(
    cache: torch.Tensor,  # [NB, BS, Hk, D]
    ids: torch.Tensor,  # [N, nb] int64 block ids
) -> torch.Tensor:  # [N, Hk, nb * BS, D]
    n, nb = ids.shape
    blocks = cache.index_select(0, ids.flatten())  # [N * nb, BS, Hk, D]; beats advanced indexing on CPU
    return blocks.view(n, nb * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)


def _attend(q, k, v, mask, scale, is_causal=False):  # q [N, Hq, L, D]; k, v [N, Hk, S, D]
    out_dtype = q.dtype
    if q.device.type == "cpu" and q.dtype != torch.float32:
        # CPU SDPA in bf16 measured ~5x slower than in fp32 for a masked 16-row decode batch
        # (16 vs 3 ms per step); fp32 is also what the Triton kernel accumulates in.
        q, k, v = q.float(), k.float(), v.float()
    elif q.dtype != k.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.to(out_dtype)


@dataclass
class _Plan:
    """What one step's metadata implies for attention; the same for every layer of the step."""

    decode_rows: torch.Tensor | None  # [Bd] query rows of single-token sequences, None if none
    all_decode: bool  # every row is a decode row, in order: no gather of q, no scatter of out
    decode_ids: torch.Tensor | None  # [Bd * nb] cache block ids to gather
    decode_bias: torch.Tensor | None  # [Bd, 1, 1, nb * BS] 0 for a real key, -inf for padding
    prefills: list[tuple[int, int, int, torch.Tensor, torch.Tensor | None]]  # (q0, q1, ctx, ids, mask)


def _plan(block_tables, cu_seqlens_q, context_lens, num_blocks: int, block_size: int) -> _Plan:
    device = block_tables.device
    cu = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    q_lens = [cu[i + 1] - cu[i] for i in range(len(ctx))]

    decode = [i for i, n in enumerate(q_lens) if n == 1]
    rows = ids = bias = None
    if decode:
        rows = torch.tensor([cu[i] for i in decode], device=device)  # [Bd]
        lens = torch.tensor([ctx[i] for i in decode], device=device)  # [Bd]
        nb = -(-max(ctx[i] for i in decode) // block_size)
        ids = _block_ids(block_tables[torch.tensor(decode, device=device), :nb], num_blocks)
        keys = torch.arange(nb * block_size, device=device)  # [S]
        # An additive 0/-inf bias gives the same result as a boolean mask and is faster on CPU.
        bias = torch.zeros(len(decode), 1, 1, nb * block_size, device=device)
        bias.masked_fill_((keys[None, :] >= lens[:, None])[:, None, None, :], float("-inf"))
    all_decode = bool(decode) and len(decode) == len(ctx)  # then rows are 0 .. B-1

    prefills = []
    for i, q_len in enumerate(q_lens):
        if q_len <= 1:
            continue
        n_ctx = ctx[i]
        nb = -(-n_ctx // block_size)
        mask = None  # a whole prompt: plain causal, the same call HF's sdpa path makes
        if q_len != n_ctx:  # a later chunk: row r sees keys 0 .. n_ctx - q_len + r
            pos = torch.arange(n_ctx - q_len, n_ctx, device=device)  # [q_len]
            mask = torch.arange(n_ctx, device=device)[None, :] <= pos[:, None]  # [q_len, ctx]
        prefills.append((cu[i], cu[i + 1], n_ctx, _block_ids(block_tables[i : i + 1, :nb], num_blocks), mask))
    return _Plan(rows, all_decode, ids, bias, prefills)


def paged_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:  # [T, Hq, D]
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    plan = per_step(
        "paged_attention",
        (block_tables, cu_seqlens_q, context_lens),
        lambda: _plan(block_tables, cu_seqlens_q, context_lens, num_blocks, block_size),
    )
    if plan.all_decode and q.shape[0] == len(context_lens):  # the common decode step: one SDPA call
        k, v = _gather_kv(k_cache, plan.decode_ids), _gather_kv(v_cache, plan.decode_ids)
        return _attend(q.unsqueeze(2), k, v, plan.decode_bias, scale).squeeze(2)

    out = torch.zeros_like(q)
    if plan.decode_rows is not None:
        k, v = _gather_kv(k_cache, plan.decode_ids), _gather_kv(v_cache, plan.decode_ids)
        qd = q[plan.decode_rows].unsqueeze(2)  # [Bd, Hq, 1, D]
        out[plan.decode_rows] = _attend(qd, k, v, plan.decode_bias, scale).squeeze(2)
    for q0, q1, n_ctx, ids, mask in plan.prefills:
        k = _gather_kv(k_cache, ids)[:, :, :n_ctx]  # [1, Hk, ctx, D]
        v = _gather_kv(v_cache, ids)[:, :, :n_ctx]
        qi = q[q0:q1].transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
        oi = _attend(qi, k, v, mask, scale, is_causal=mask is None)
        out[q0:q1] = oi.squeeze(0).transpose(0, 1)
    return out
