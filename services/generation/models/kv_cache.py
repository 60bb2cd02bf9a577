"""The paged KV cache's memory: one K and one V tensor per layer, [num_blocks, block_size, Hk, D].

On CPU each tensor lives in its own anonymous mapping, whose pages the kernel zero-fills on first
touch: the cache costs resident memory (RSS) only for the blocks that have been written
(llama-server's RSS also grows with its load), instead of all of it from start-up (torch.zeros
writes every page). The block manager (bound_resident) reuses written blocks before it writes new
ones once it holds twice the busiest moment's blocks, so under sustained traffic RSS follows the
load's working set, not the size of the cache; and when the engine goes idle, the free blocks the
block manager reclaims (those that cache nothing, and cached ones beyond what the busiest moment
since the last time needed) give their pages back (release_blocks), so resident KV shrinks with the load.
"""

from __future__ import annotations

import math
import mmap

import torch

from services.generation.models.config import DecoderConfig


class KVCache:
    """Separate tensors per layer (not one [L, ...] tensor) so each layer's cache is a whole tensor
    that a compiled graph's in-place cache write can mutate without a view of a larger input."""

    def __init__(self, config: DecoderConfig, num_blocks: int, block_size: int, device, dtype):
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self._mappings: list[mmap.mmap] = []  # CPU: each tensor's mapping, in self.k + self.v order
        self.k = [self._zeros(shape, device, dtype) for _ in range(config.num_layers)]
        self.v = [self._zeros(shape, device, dtype) for _ in range(config.num_layers)]

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    @property
    def resident_on_write(self) -> bool:
        """Whether a block costs resident memory only once written (the CPU mappings)."""
        return bool(self._mappings)

    def clear_blocks(self, block_ids: list[int]) -> None:
        """Zero blocks that may hold non-finite values, so no later reader can pick them up."""
        if block_ids:
            index = torch.tensor(block_ids, device=self.k[0].device)
            for cache in self.k + self.v:
                cache[index] = 0

    def release_blocks(self, block_ids: list[int], layers: list[int] | None = None) -> int:
        """Give the pages of these blocks back to the OS (in every layer, or only in ``layers``: the
        sliding-window layers of blocks they never read again); they read as zeros when next written.
        Only pages wholly inside a run of consecutive listed blocks go: a page shared with a block
        that is not listed keeps its data. Returns the bytes released (0 off the CPU mappings)."""
        if not self._mappings or not block_ids:
            return 0
        n = len(self.k)  # self._mappings holds k[0..n-1], then v[0..n-1]
        mappings = self._mappings if layers is None else [self._mappings[j] for i in layers for j in (i, n + i)]
        block_bytes = self.k[0][0].numel() * self.k[0].element_size()
        released = 0
        for first, end in _runs(sorted(block_ids)):
            lo = -(-first * block_bytes // mmap.PAGESIZE) * mmap.PAGESIZE  # round up to a page
            hi = end * block_bytes // mmap.PAGESIZE * mmap.PAGESIZE  # round down
            if hi > lo:
                for mapping in mappings:
                    mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                released += (hi - lo) * len(mappings)
        return released

    def _zeros(self, shape: tuple[int, ...], device, dtype: torch.dtype) -> torch.Tensor:
        count = math.prod(shape)
        if torch.device(device).type != "cpu" or count == 0:
            return torch.zeros(shape, device=device, dtype=dtype)
        # Private (Python's default for -1 is shared: shmem, charged differently and never a huge
        # page). torch.frombuffer holds a reference to the mapping for as long as the tensor lives.
        mapping = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._mappings.append(mapping)
        return torch.frombuffer(mapping, dtype=dtype, count=count).view(shape)


def _runs(sorted_ids: list[int]):
    """(first, end) of each run of consecutive ids, end exclusive."""
    first = prev = sorted_ids[0]
    for i in sorted_ids[1:]:
        if i != prev + 1:
            yield first, prev + 1
            first = i
        prev = i
    yield first, prev + 1
