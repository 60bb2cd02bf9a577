"""The CPU KV cache is zero and writable like torch.zeros, but costs resident memory only for the
blocks written (anonymous mapping, pages committed on first touch)."""

from __future__ import annotations

import psutil
import torch

from services.generation.models.config import LlamaConfig
from services.generation.models.llama import KVCache

# 8 layers x K and V x 256 blocks x 16 tokens x 4 heads x 64 x 4 bytes = 64 MiB in all.
CONFIG = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=512, num_layers=8, num_heads=4,
                     num_kv_heads=4, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=4096,
                     tie_word_embeddings=True)
BLOCK_BYTES = 16 * 4 * 64 * 4


def _rss() -> int:
    return psutil.Process().memory_info().rss


def test_the_cache_is_zero_writable_and_clearable():
    cache = KVCache(CONFIG, num_blocks=8, block_size=16, device="cpu", dtype=torch.bfloat16)
    k = cache.k[3]
    assert k.shape == (8, 16, 4, 64) and k.dtype == torch.bfloat16 and k.is_contiguous()
    assert not any(t.any() for t in cache.k + cache.v)
    k[2, 5] = 1.5
    assert k[2, 5].float().sum().item() == 1.5 * 4 * 64 and k[1].count_nonzero() == 0
    cache.clear_blocks([2])
    assert k.count_nonzero() == 0
    assert len({t.data_ptr() for t in cache.k + cache.v}) == 2 * CONFIG.num_layers  # no shared storage


def test_only_written_blocks_become_resident():
    before = _rss()
    cache = KVCache(CONFIG, num_blocks=256, block_size=16, device="cpu", dtype=torch.float32)
    allocated = _rss() - before
    for t in cache.k + cache.v:  # one block per tensor written: 16 x 16 KiB
        t[7] = 1.0
    written = _rss() - before
    full = 2 * CONFIG.num_layers * 256 * BLOCK_BYTES
    assert full == 64 << 20
    assert allocated < full // 8, f"{allocated >> 20} MiB resident right after allocating a {full >> 20} MiB cache"
    assert written < full // 4, f"{written >> 20} MiB resident after writing 16 blocks of 16 KiB"
