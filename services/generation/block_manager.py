"""Fixed-size KV blocks: ref counts, a free list, and automatic prefix caching (no torch, no grpc).

A block holds ``block_size`` consecutive tokens of one or more sequences. Once a block is full and
its K/V computed, it is registered under a hash of (hash of the previous block, its tokens), so a
later sequence with the same prefix reuses it instead of recomputing it. Freed blocks keep their
hash while they sit in the free list (least recently freed reused first), so a prefix survives
until its block is actually needed for something else.

Which free block a new token gets, in order: a used-before block with nothing cached in it; then a
never-used block; then the least recently freed cached block. With ``bound_resident`` (a CPU cache
whose pages become resident memory only when first written, models/kv_cache.py), never-used blocks
are taken only while the blocks ever used number fewer than twice the most that were in use at once
since the last ``reclaim_free_blocks`` (at least ``MIN_RESIDENT_BLOCKS``); past that a cached block
is reused first. Without it, sustained traffic walks the free list through every block and the
process keeps the whole cache resident (0.38 GB for the default 16k tokens) to retain prefixes
nobody asked for again; with it, resident KV follows the load's working set and the prefix cache
still keeps at least as many free blocks as the busiest moment used. When the engine goes idle (at
most every 5 s, services/generation/heap.py ``IdleRelease``: ``reclaim_free_blocks``), the free
blocks that cache nothing, and the cached ones beyond as many as the busiest moment used, become
never-used again and the cache gives their pages back to the OS; the busiest moment then counts
from there, so resident KV also shrinks when the load does. Idle, the cache keeps one busiest
moment's worth of prefixes, not the two it may write under load: with twice, every burst of new
text (sampled outputs are cached too) added blocks until the whole cache was resident, and
identical rounds of 64 requests grew RSS by ~20 MB each (issue 28).

Sliding-window layers (``window`` > 0: Gemma 3's, Mistral's, windowed Qwen layers) never read a
key again once every query still to come is more than ``window`` positions past it, i.e. keys before
``num_computed_tokens - window + 1``. A block every holder has moved that far past, counted from the
end of its last full block (so a later turn of the conversation can still hit every full block in
the prefix cache: one block of slack), is *window released*: the windowed layers' pages of it may go back to the OS (``take_window_releases``; the
runner releases them), while the full-attention layers keep the block (its id stays taken, so a
Gemma 3 conversation's resident KV grows with its global layers only). A prefix-cache hit is cut
back to the longest prefix whose window (the blocks the first recomputed query reads) is intact.
When every layer is windowed (Mistral, ``reuse_passed``), nothing reads a passed block at all: the
sequence drops it at once (its table entry becomes the *null block*, one block no sequence ever
holds, which a windowed kernel never reads and a masked one reads as zeros), and the block goes
back to the free list, hash and K/V intact, when its last holder drops it. A conversation then holds
``window / block_size + 2`` blocks whatever its length, on every device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice

from services.generation.sequence import Sequence

_ROOT_HASH = 0x6D73746172  # parent hash of a sequence's first block
MIN_RESIDENT_BLOCKS = 64  # bound_resident never limits a cache to fewer blocks than this


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple = ()  # its tokens (and image hashes: Sequence.block_key), to rule out hash collisions
    passed: int = 0  # holders that have moved past it by more than the window (sliding-window layers)
    window_released: bool = False  # the windowed layers' K/V of it are gone (released pages)


def hash_block(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, bound_resident: bool = False, window: int = 0,
                 reuse_passed: bool = False, max_chunk_tokens: int = 0):
        """num_blocks: the KV cache's blocks; with reuse_passed (every layer windowed) the last of
        them is the null block and the others are handed out. max_chunk_tokens: the most tokens a
        sequence computes in one step (num_sequence_tokens)."""
        if num_blocks < 1 + reuse_passed or block_size < 1:
            raise ValueError(f"need num_blocks >= {1 + reuse_passed} and block_size >= 1, got {num_blocks}, {block_size}")
        if reuse_passed and not window:
            raise ValueError("reuse_passed needs a window")
        self.null_block_id = num_blocks - 1 if reuse_passed else None
        self.blocks = [Block(i) for i in range(num_blocks)]
        num_blocks -= reuse_passed
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bound_resident = bound_resident
        self.window = window  # the windowed layers' window in keys; 0 = no windowed layers
        self.max_chunk_tokens = max_chunk_tokens
        self._window_releases: list[int] = []  # window released since the last take_window_releases
        self.hash_to_block_id: dict[int, int] = {}
        # Free blocks used before: nothing cached first, then cached ones least recently freed first.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict()
        self.unused_block_ids = list(range(num_blocks - 1, -1, -1))  # never used; pop() = lowest id
        self.peak_used_blocks = 0
        # Cumulative prefix-cache counters (prompt tokens looked up / found), for the hit rate.
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids) + len(self.unused_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_ever_used_blocks(self) -> int:
        """Blocks written at least once: with bound_resident, the part of the cache that is resident."""
        return self.num_blocks - len(self.unused_block_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_sequence_tokens(self) -> float:
        """The longest sequence the pool holds alone: all of it, unless passed blocks are reused and
        the most a sequence then holds at once (its window, a block of slack, a step's chunk, two
        blocks of rounding) fits: then any length (inf)."""
        if self.null_block_id is not None and self.max_chunk_tokens > 0:
            most_held = self.num_blocks_for(self.window + self.block_size + self.max_chunk_tokens) + 2
            if most_held <= self.num_blocks:
                return float("inf")
        return self.num_tokens

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """Give a block-less sequence the cached blocks of its longest cached prefix.

        At least one token is always left to compute (its logits are needed), so the lookup stops
        before the block holding the last token. Returns the number of tokens reused.
        """
        if seq.block_table:
            raise ValueError("allocate_cached_prefix needs a sequence without blocks")
        num_lookup_blocks = (len(seq) - 1) // self.block_size
        parent = _ROOT_HASH
        hits: list[int] = []
        for i in range(num_lookup_blocks):
            tokens = seq.block_key(i, self.block_size)
            h = seq.block_hashes[i] if i < len(seq.block_hashes) else hash_block(parent, tokens)
            block_id = self.hash_to_block_id.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            parent = h
        hits = hits[: self._intact_window_prefix(hits)]
        for block_id in hits:
            self._take(block_id)
        seq.block_table = hits
        seq.num_computed_tokens = len(hits) * self.block_size
        self.pass_window(seq)  # blocks before the first query's window: passed at once
        self.num_prefix_query_tokens += len(seq)
        self.num_prefix_hit_tokens += seq.num_computed_tokens
        return seq.num_computed_tokens

    def _first_window_block(self, num_computed_tokens: int) -> int:
        """The first block a query at position num_computed_tokens (or later) reads in a windowed layer."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size if self.window else 0

    def _intact_window_prefix(self, hits: list[int]) -> int:
        """How many of the cached blocks `hits` a sequence may reuse: the first recomputed query
        reads the windowed layers' K/V of the blocks in its window, so none of those may be released."""
        n = len(hits)
        while n and any(self.blocks[b].window_released for b in hits[self._first_window_block(n * self.block_size):n]):
            n -= 1
        return n

    def pass_window(self, seq: Sequence) -> None:
        """After seq's K/V grew: count it past the blocks its windowed layers will never read again;
        a block every holder has passed is window released."""
        if not self.window:
            return
        # From the last full block's end, not the last token: a prefix-cache hit ends on a block
        # boundary, and the conversation's next turn should be able to reuse all of its full blocks.
        last_full = seq.num_computed_tokens // self.block_size * self.block_size
        passed = min(self._first_window_block(last_full), len(seq.block_table))
        for i in range(seq.num_passed_blocks, passed):
            block = self.blocks[seq.block_table[i]]
            if self.null_block_id is not None:  # nothing reads it again: dropped, reusable
                seq.block_table[i] = self.null_block_id
                self._drop(block, keep_cache=True)
                continue
            block.passed += 1
            self._maybe_release_window(block)
        seq.num_passed_blocks = max(seq.num_passed_blocks, passed)

    def take_window_releases(self) -> list[int]:
        """The blocks window released since the last call (their windowed layers' pages may go)."""
        ids, self._window_releases = self._window_releases, []
        return ids

    def _maybe_release_window(self, block: Block) -> None:
        if block.ref_count and block.passed == block.ref_count and not block.window_released:
            block.window_released = True
            self._window_releases.append(block.block_id)

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Hash the sequence's blocks that became full and computed, so others can reuse them."""
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[i - 1] if i else _ROOT_HASH
            tokens = seq.block_key(i, self.block_size)
            h = hash_block(parent, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block_id:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block_id[h] = block.block_id

    # -- allocation ---------------------------------------------------------------------------

    def num_new_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(self.num_blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table), 0)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Add the blocks that the next num_new_tokens of seq need (call can_allocate first)."""
        num_needed = self.num_new_blocks_needed(seq, num_new_tokens)
        if num_needed > self.num_free_blocks:
            raise RuntimeError(f"need {num_needed} blocks, {self.num_free_blocks} free")
        for _ in range(num_needed):
            block_id = self._next_free_block()
            self._evict(block_id)
            self._take(block_id)
            seq.block_table.append(block_id)

    def free(self, seq: Sequence, keep_cache: bool = True) -> None:
        """Drop seq's references. keep_cache=False also forgets its blocks' hashes (bad K/V)."""
        # Tail first, so the blocks of a shared prefix are the last to be reused.
        for i in range(len(seq.block_table) - 1, -1, -1):
            block = self.blocks[seq.block_table[i]]
            if block.block_id == self.null_block_id:  # dropped when seq passed it (reuse_passed)
                continue
            if i < seq.num_passed_blocks:
                block.passed -= 1
            self._drop(block, keep_cache)
        seq.block_table = []
        seq.num_passed_blocks = 0
        if not keep_cache:
            seq.block_hashes = []

    def _drop(self, block: Block, keep_cache: bool) -> None:
        """One holder lets go of block; with none left it joins the free list."""
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block.block_id} freed more often than taken")
        block.ref_count -= 1
        self._maybe_release_window(block)  # the holders left may all have passed it
        if not keep_cache:
            self._evict(block.block_id)
        if block.ref_count == 0:
            self.free_block_ids[block.block_id] = None
            if block.hash is None:  # nothing worth keeping: reuse it first
                self.free_block_ids.move_to_end(block.block_id, last=False)

    def reclaim_free_blocks(self) -> list[int]:
        """When the engine goes idle: turn free blocks back into never-used ones and return their
        ids, so the caller can release their memory. First every free block that caches nothing (a
        sequence's partly filled last block, K/V evicted as bad: garbage either way); then, with
        bound_resident, cached blocks least recently freed first, until the blocks ever used are
        no more than the busiest moment since the previous call used (at least
        MIN_RESIDENT_BLOCKS). That busiest moment then starts over from what is in use now, so
        a burst's blocks are given back once a calmer period has gone by, and the bound follows
        the load down as well as up."""
        ids = [b for b in self.free_block_ids if self.blocks[b].hash is None]
        if self.bound_resident:
            excess = self.num_ever_used_blocks - len(ids) - max(self.peak_used_blocks, MIN_RESIDENT_BLOCKS)
            cached = (b for b in self.free_block_ids if self.blocks[b].hash is not None)
            ids += islice(cached, max(excess, 0))
        for block_id in ids:
            self._evict(block_id)
            del self.free_block_ids[block_id]
        if ids:
            self.unused_block_ids = sorted([*self.unused_block_ids, *ids], reverse=True)  # pop() = lowest id
        self.peak_used_blocks = self.num_used_blocks
        return ids

    def _resident_limit(self) -> int:
        return max(2 * self.peak_used_blocks, MIN_RESIDENT_BLOCKS)

    def _next_free_block(self) -> int:
        """The free block to give out next (the order in the module docstring)."""
        first = next(iter(self.free_block_ids), None)
        if first is not None and (self.blocks[first].hash is None or not self.unused_block_ids):
            return first
        if first is not None and self.bound_resident and self.num_ever_used_blocks >= self._resident_limit():
            return first
        return self.unused_block_ids[-1]

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            if self.unused_block_ids and self.unused_block_ids[-1] == block_id:
                self.unused_block_ids.pop()
            else:
                del self.free_block_ids[block_id]
        block.ref_count += 1
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids = None, ()
        if not block.ref_count:  # what it held is forgotten: the next holder writes every layer afresh
            block.window_released, block.passed = False, 0
