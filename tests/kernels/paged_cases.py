"""Builders shared by the paged-attention tests: a random paged KV cache and a naive oracle."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [NB, BS, Hk, D]
    v_cache: torch.Tensor  # [NB, BS, Hk, D]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32
    scale: float

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.cu_seqlens_q, self.context_lens, self.scale)

    def to(self, device: torch.device) -> PagedBatch:
        moved = [t.to(device) if isinstance(t, torch.Tensor) else t for t in self.args()]
        return PagedBatch(*moved)


def make_paged_batch(
    context_lens: list[int],
    q_lens: list[int],
    n_q_heads: int,
    n_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
) -> PagedBatch:
    """Sequences get shuffled, non-contiguous blocks; table entries past a sequence's last block
    hold -1 (never read) and three spare blocks hold noise (never attended)."""
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    n_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.randn(n_blocks, block_size, n_kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(n_blocks, block_size, n_kv_heads, head_dim).to(dtype)
    perm = torch.randperm(n_blocks).to(torch.int32)
    tables = torch.full((len(context_lens), max(blocks_per_seq) + 2), -1, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = perm[used : used + nb]
        used += nb
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), n_q_heads, head_dim).to(dtype)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    return PagedBatch(q, k_cache, v_cache, tables, cu, ctx, head_dim**-0.5)


def naive_attention(batch: PagedBatch) -> torch.Tensor:  # [T, Hq, D] fp32
    """Dense causal attention, one query row at a time, in float64: the oracle for the reference."""
    q, kc, vc = batch.q.double(), batch.k_cache.double(), batch.v_cache.double()
    bs = kc.shape[1]
    group = q.shape[1] // kc.shape[2]
    out = torch.zeros_like(q)
    cu, ctx = batch.cu_seqlens_q.tolist(), batch.context_lens.tolist()
    for i, n_ctx in enumerate(ctx):
        table = batch.block_tables[i].long()
        keys = torch.stack([kc[table[n // bs], n % bs] for n in range(n_ctx)])  # [ctx, Hk, D]
        values = torch.stack([vc[table[n // bs], n % bs] for n in range(n_ctx)])
        q_len = cu[i + 1] - cu[i]
        for r in range(q_len):
            t, pos = cu[i] + r, n_ctx - q_len + r
            for h in range(q.shape[1]):
                scores = keys[: pos + 1, h // group] @ q[t, h] * batch.scale  # [pos + 1]
                out[t, h] = torch.softmax(scores, 0) @ values[: pos + 1, h // group]
    return out.float()
