"""The CPU KV cache is zero and writable like torch.zeros, but costs resident memory only for the
blocks written (anonymous mapping, pages committed on first touch)."""

from __future__ import annotations

import psutil
import torch

from services.generation.models.config import DecoderConfig
from services.generation.models.kv_cache import KVCache

# 8 layers x K and V x 256 blocks x 16 tokens x 4 heads x 64 x 4 bytes = 64 MiB in all.
CONFIG = DecoderConfig(vocab_size=64, hidden_size=256, intermediate_size=512, num_layers=8, num_heads=4,
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


def test_released_blocks_give_their_pages_back_and_read_as_zero():
    cache = KVCache(CONFIG, num_blocks=256, block_size=16, device="cpu", dtype=torch.float32)
    for t in cache.k + cache.v:
        t[:200] = 2.0  # 200 blocks of 16 KiB in each of 16 tensors: 50 MiB
    written = _rss()
    released = cache.release_blocks([*range(10, 190), 199])  # 180 in a run, and one alone
    assert released == 181 * BLOCK_BYTES * 2 * CONFIG.num_layers  # 16 KiB blocks are whole pages
    dropped = written - _rss()
    assert dropped > released * 3 // 4, f"RSS fell by {dropped >> 20} MiB after releasing {released >> 20} MiB"
    k = cache.k[5]
    assert k[10:190].count_nonzero() == 0 and k[199].count_nonzero() == 0
    assert (k[:10] == 2.0).all() and (k[190:199] == 2.0).all()  # the blocks around them keep their data
    k[12] = 3.0  # and released blocks are writable again
    assert (k[12] == 3.0).all()


def test_a_page_shared_with_a_kept_block_is_not_released():
    small = DecoderConfig(**{**CONFIG.__dict__, "num_kv_heads": 2, "head_dim": 96})  # 6 KiB bf16 blocks
    cache = KVCache(small, num_blocks=64, block_size=16, device="cpu", dtype=torch.bfloat16)
    for t in cache.k + cache.v:
        t.fill_(1.0)
    assert cache.release_blocks([1]) == 4096 * 2 * small.num_layers  # bytes 6 KiB..12 KiB: one whole page
    assert cache.release_blocks([3, 4]) == 8192 * 2 * small.num_layers  # 18 KiB..30 KiB: two whole pages
    k = cache.k[0]
    assert (k[0] == 1.0).all() and (k[2] == 1.0).all() and (k[5] == 1.0).all()
