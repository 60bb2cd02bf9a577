"""Paged KV-cache write reference.

For every token t with slot = slot_mapping[t] >= 0 (slot = block_id * BS + offset_in_block):
    k_cache[slot // BS, slot % BS] = k[t];  v_cache[slot // BS, slot % BS] = v[t]
Slot -1 marks a padding token that is skipped. k, v: [T, Hk, D]; caches [NB, BS, Hk, D].
"""

from __future__ import annotations

import torch


def store_kv_ref(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    keep = slot_mapping >= 0  # [T]
    slots = slot_mapping[keep]
    block_size = k_cache.shape[1]
    # Advanced-index assignment writes through to the cache and works for any cache strides.
    k_cache[slots // block_size, slots % block_size] = k[keep].to(k_cache.dtype)
    v_cache[slots // block_size, slots % block_size] = v[keep].to(v_cache.dtype)
