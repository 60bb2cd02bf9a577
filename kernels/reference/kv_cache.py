"""Paged KV-cache write reference.

For every token t with slot = slot_mapping[t] >= 0 (slot = block_id * BS + offset_in_block):
    k_cache[slot // BS, slot % BS] = k[t];  v_cache[slot // BS, slot % BS] = v[t]
Slot -1 marks a padding token that is skipped. k, v: [T, Hk, D]; caches [NB, BS, Hk, D].
"""

from __future__ import annotations

import torch

from kernels.reference.step_memo import per_step


def store_kv_ref(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    slots, keep = per_step("store_kv", (slot_mapping,), lambda: _valid_slots(slot_mapping))
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        # One index_copy_ into the [NB * BS, Hk, D] view: measured ~2x faster than index_put.
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, _rows(k, keep).to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, _rows(v, keep).to(v_cache.dtype))
        return
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    # Advanced-index assignment writes through to the cache and works for any cache strides.
    k_cache[blocks, offsets] = _rows(k, keep).to(k_cache.dtype)
    v_cache[blocks, offsets] = _rows(v, keep).to(v_cache.dtype)


def _valid_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(slots >= 0, the row mask selecting them), the mask None when no row is padding."""
    keep = slot_mapping >= 0  # [T]
    if bool(keep.all()):
        return slot_mapping, None
    return slot_mapping[keep], keep


def _rows(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return x if keep is None else x[keep]
