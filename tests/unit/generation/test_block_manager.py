import pytest

from services.generation.block_manager import MIN_RESIDENT_BLOCKS, BlockManager
from services.generation.sampling_params import SamplingParams
from services.generation.sequence import Sequence, Timing


def seq(tokens, seq_id=0):
    return Sequence(seq_id, seq_id, list(tokens), SamplingParams(), 0, Timing(0.0, 0.0))


def compute(bm, s, n):
    bm.allocate(s, n)
    s.num_computed_tokens += n
    bm.register_computed_blocks(s)
    bm.pass_window(s)  # what the engine step does after each step (a no-op without a window)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(8, 4)
    s = seq(range(10))
    assert bm.can_allocate(s, 10)
    compute(bm, s, 10)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    assert all(bm.blocks[b].ref_count == 1 for b in s.block_table)
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == []
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_incremental_allocation_only_adds_blocks_at_boundaries():
    bm = BlockManager(8, 4)
    s = seq(range(3))
    compute(bm, s, 3)
    assert len(s.block_table) == 1
    s.append_output(7)
    assert bm.num_new_blocks_needed(s, 1) == 0  # position 3 still fits in block 0
    compute(bm, s, 1)
    s.append_output(8)
    assert bm.num_new_blocks_needed(s, 1) == 1


def test_cannot_allocate_beyond_pool():
    bm = BlockManager(2, 4)
    s = seq(range(9))
    assert not bm.can_allocate(s, 9)
    assert bm.can_allocate(s, 8)


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(16, 4)
    a = seq(range(10), 0)
    compute(bm, a, 10)  # blocks 0..1 full -> hashed
    b = seq(list(range(8)) + [99, 98, 97], 1)
    hit = bm.allocate_cached_prefix(b)
    assert hit == 8 and b.num_computed_tokens == 8
    assert b.block_table == a.block_table[:2]
    assert [bm.blocks[x].ref_count for x in b.block_table] == [2, 2]
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_table] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16 and min(x.ref_count for x in bm.blocks) == 0


def test_prefix_lookup_leaves_the_last_token_to_compute():
    bm = BlockManager(16, 4)
    a = seq(range(8), 0)
    compute(bm, a, 8)
    b = seq(range(8), 1)  # identical prompt: the last block must be recomputed for its logits
    assert bm.allocate_cached_prefix(b) == 4
    assert b.num_schedulable_tokens == 4


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(4, 4)
    a = seq(range(8), 0)
    compute(bm, a, 8)
    bm.free(a)
    b = seq(list(range(8)) + [5], 1)
    assert bm.allocate_cached_prefix(b) == 8  # found in the free list
    assert bm.num_free_blocks == 2
    bm.free(b)
    c = seq(range(100, 116), 2)  # takes every block: the old prefix is evicted
    compute(bm, c, 16)
    d = seq(list(range(8)) + [5], 3)
    bm.free(c)
    assert bm.allocate_cached_prefix(d) == 0


def _serve_distinct_prompts(bm, rounds, concurrent, blocks_each):
    """Rounds of `concurrent` sequences with prompts never seen before, each filling its blocks."""
    tokens = iter(range(10**9))
    for r in range(rounds):
        seqs = [seq([next(tokens) for _ in range(blocks_each * bm.block_size)], r * concurrent + i)
                for i in range(concurrent)]
        for s in seqs:
            compute(bm, s, len(s))
        for s in seqs:
            bm.free(s)


@pytest.mark.parametrize("bound_resident", [False, True])
def test_sustained_traffic_touches_every_block_unless_resident_memory_is_bounded(bound_resident):
    bm = BlockManager(1024, 4, bound_resident=bound_resident)
    _serve_distinct_prompts(bm, rounds=200, concurrent=8, blocks_each=6)  # 48 blocks in use at a time
    assert bm.peak_used_blocks == 48 and bm.num_free_blocks == 1024
    if bound_resident:  # twice the busiest moment (or the floor), however long it runs
        assert bm.num_ever_used_blocks == max(2 * 48, MIN_RESIDENT_BLOCKS)
    else:
        assert bm.num_ever_used_blocks == 1024


def test_bounded_resident_memory_still_keeps_recent_prefixes_and_grows_with_load():
    bm = BlockManager(1024, 4, bound_resident=True)
    _serve_distinct_prompts(bm, rounds=50, concurrent=8, blocks_each=6)  # at its bound: 96 blocks ever used
    a = seq(range(-40, 0), 0)  # 10 blocks, computed and freed: the most recently freed cached blocks
    compute(bm, a, 40)
    bm.free(a)
    _serve_distinct_prompts(bm, rounds=1, concurrent=8, blocks_each=6)  # reuses the 48 least recent
    assert bm.num_ever_used_blocks == 96
    assert bm.allocate_cached_prefix(seq(list(range(-40, 0)) + [1], 99)) == 40
    bm2 = BlockManager(1024, 4, bound_resident=True)
    _serve_distinct_prompts(bm2, rounds=5, concurrent=100, blocks_each=2)  # a burst of 200 blocks at once
    assert bm2.peak_used_blocks == 200 and bm2.num_ever_used_blocks == 2 * 200
    assert bm2.can_allocate(seq(range(4 * 1024)), 4 * 1024)  # every block can still be had


def test_free_without_cache_forgets_hashes():
    bm = BlockManager(4, 4)
    a = seq(range(8), 0)
    compute(bm, a, 8)
    bm.free(a, keep_cache=False)
    assert bm.hash_to_block_id == {}
    assert bm.allocate_cached_prefix(seq(list(range(8)) + [1], 1)) == 0


def test_double_free_is_refused():
    bm = BlockManager(4, 4)
    a = seq(range(4), 0)
    compute(bm, a, 4)
    table = list(a.block_table)
    bm.free(a)
    a.block_table = table
    try:
        bm.free(a)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a second free must raise, never go negative")
    assert all(b.ref_count >= 0 for b in bm.blocks)


def test_hit_rate_counters():
    bm = BlockManager(16, 4)
    a = seq(range(9), 0)
    bm.allocate_cached_prefix(a)
    compute(bm, a, 9)
    b = seq(range(9), 1)
    bm.allocate_cached_prefix(b)
    assert bm.num_prefix_query_tokens == 18 and bm.num_prefix_hit_tokens == 8


def test_reclaiming_turns_free_uncached_blocks_into_never_used_ones():
    bm = BlockManager(16, 4, bound_resident=True)
    a, b = seq(range(10), 0), seq(range(100, 106), 1)  # 2 full blocks + 2 tokens; 1 full + 2 tokens
    compute(bm, a, 10)
    compute(bm, b, 6)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4]
    bm.free(a)
    assert bm.num_ever_used_blocks == 5
    assert bm.reclaim_free_blocks() == [2]  # a's partly filled last block; b still runs
    assert bm.num_ever_used_blocks == 4 and bm.num_free_blocks == 14
    assert bm.reclaim_free_blocks() == []
    assert bm.allocate_cached_prefix(seq(list(range(10)) + [7], 2)) == 8  # the cached blocks stay
    bm.free(b)
    assert bm.reclaim_free_blocks() == [4]
    c = seq(range(200, 205), 3)
    compute(bm, c, 5)
    assert c.block_table == [2, 4]  # lowest ids first, like never-used blocks


def test_going_idle_gives_back_cached_blocks_beyond_twice_the_calmer_loads_need():
    bm = BlockManager(1024, 4, bound_resident=True)
    tokens = iter(range(10**9))

    def serve(concurrent, blocks_each):
        seqs = [seq([next(tokens) for _ in range(blocks_each * 4)], i) for i in range(concurrent)]
        for s in seqs:
            compute(bm, s, len(s))
        for s in seqs:
            bm.free(s)
        return seqs

    serve(100, 2)  # a burst: 200 blocks in use at once
    assert bm.reclaim_free_blocks() == []  # within twice its own busiest moment: all kept
    assert bm.num_ever_used_blocks == 200 and bm.peak_used_blocks == 0
    for _ in range(10):
        last = serve(4, 6)  # a calmer load: 24 blocks in use at a time
    assert bm.num_ever_used_blocks == 200  # it reused the burst's blocks instead of writing new ones
    reclaimed = bm.reclaim_free_blocks()
    assert len(reclaimed) == 200 - MIN_RESIDENT_BLOCKS and bm.num_ever_used_blocks == MIN_RESIDENT_BLOCKS
    assert all(bm.blocks[b].hash is None for b in reclaimed) and bm.num_free_blocks == 1024
    for s in last:  # the most recently freed prefixes are what stays cached
        probe = seq([*s.token_ids, 1], 99)
        assert bm.allocate_cached_prefix(probe) == 24
        bm.free(probe)


def test_identical_bursts_leave_the_same_blocks_resident_when_idle():
    """Issue 28: identical rounds of a burst (the same prompts, new sampled text: cached too) grew
    RSS every round, because going idle kept twice the busiest moment's blocks, and each round's
    new text took never-used blocks up to that bound. Idle, one busiest moment's worth stays (the
    most recently freed: this round's prompts and text), so every round leaves the same resident
    blocks, and the prompts still hit the cache."""
    bm = BlockManager(1024, 4, bound_resident=True)
    text = iter(range(10**6, 10**9))
    resident, hits = [], []
    for _ in range(6):
        seqs = [seq([*range(i * 12, i * 12 + 12), *(next(text) for _ in range(8))], i) for i in range(16)]
        hits.append(sum(bm.allocate_cached_prefix(s) for s in seqs))
        for s in seqs:
            compute(bm, s, len(s) - s.num_computed_tokens)
        for s in seqs:
            bm.free(s)
        bm.reclaim_free_blocks()
        resident.append(bm.num_ever_used_blocks)
    assert resident == [16 * 5] * 6  # 16 requests x (3 prompt + 2 text blocks) at once
    assert hits == [0] + [16 * 12] * 5


# -- window release (sliding-window layers): a block's windowed K/V may go once every holder is more
# than the window past it, never earlier; a prefix-cache hit never reuses a block whose windowed K/V
# its first query still reads.

WINDOW, BS = 8, 4  # a query at position p reads keys p - 7 .. p


def test_a_block_goes_once_every_later_query_is_past_the_window():
    bm = BlockManager(16, BS, window=WINDOW)
    s = seq(range(40))
    compute(bm, s, 11)  # a query at 11 reads keys 4..11, but a prefix hit at the boundary 8 reads 1..8
    assert bm.take_window_releases() == []
    compute(bm, s, 5)  # at 16 (a boundary): queries from 16 on read keys 9.. : blocks 0 and 1 go
    assert bm.take_window_releases() == s.block_table[:2]
    compute(bm, s, 3)  # 19: the last boundary is still 16
    assert bm.take_window_releases() == []
    compute(bm, s, 1)  # 20 reads 13..: block 2 (8-11) goes
    assert bm.take_window_releases() == [s.block_table[2]]
    assert [bm.blocks[b].window_released for b in s.block_table] == [True, True, True, False, False]


def test_no_window_no_release():
    bm = BlockManager(16, BS)
    s = seq(range(40))
    compute(bm, s, 40)
    assert bm.take_window_releases() == [] and not any(b.window_released for b in bm.blocks)


def test_a_shared_block_waits_for_every_holder():
    bm = BlockManager(32, BS, window=WINDOW)
    prompt = list(range(12))
    a = seq(prompt + [100] * 20, 0)
    compute(bm, a, 12)
    b = seq(prompt + [200], 1)
    assert bm.allocate_cached_prefix(b) == 12  # blocks 0-2 shared; b's first query (12) reads 5..12
    compute(bm, a, 10)  # a is at 22 (boundary 20, reading 13..): past blocks 0-2, but b still reads 1 and 2
    assert bm.take_window_releases() == [a.block_table[0]]  # b passed block 0 when it took it
    bm.free(b)  # the holder that still read them left: a alone has passed them
    assert sorted(bm.take_window_releases()) == sorted(a.block_table[1:3])


def test_a_prefix_hit_stops_before_a_window_it_cannot_read():
    bm = BlockManager(32, BS, window=WINDOW)
    prompt = list(range(12))
    a = seq(prompt + list(range(50, 70)), 0)
    compute(bm, a, 32)  # at 32: blocks 0..5 released (keys < 25)
    assert [bm.blocks[x].window_released for x in a.block_table] == [True] * 6 + [False, False]
    bm.free(a)
    # the whole conversation again plus a turn: its first query (32) reads 25..32: blocks 6-7, intact
    longer = seq(list(a.token_ids) + [7, 7, 7], 1)
    assert bm.allocate_cached_prefix(longer) == 32
    bm.free(longer)
    # only the first 12 tokens shared: a query at 12 would read blocks 1-2, whose windowed K/V are
    # gone, nor can a hit of 2 or 1 blocks read theirs: recomputed from the start
    diverging = seq(prompt + [9, 9, 9, 9, 9], 2)
    assert bm.allocate_cached_prefix(diverging) == 0 and diverging.block_table == []


def test_a_reused_block_starts_with_every_layer_written():
    bm = BlockManager(4, BS, window=WINDOW)
    a = seq(range(16), 0)
    compute(bm, a, 16)
    assert bm.take_window_releases() == a.block_table[:2]
    bm.free(a, keep_cache=False)
    assert not any(b.window_released or b.passed for b in bm.blocks)
    c = seq(range(100, 116), 1)
    compute(bm, c, 4)
    assert bm.take_window_releases() == [] and not bm.blocks[c.block_table[0]].window_released


# -- every layer windowed (Mistral): a passed block is dropped at once and reused, so a sequence holds
# window / block_size + 2 blocks however long it gets.

def test_every_layer_windowed_holds_a_window_of_blocks_however_long():
    bm = BlockManager(8, BS, window=WINDOW, reuse_passed=True)
    null = bm.null_block_id
    assert (null, bm.num_blocks, bm.num_free_blocks) == (7, 7, 7)
    s = seq(range(200))
    for _ in range(200):
        compute(bm, s, 1)
        held = [b for b in s.block_table if b != null]
        assert len(held) <= WINDOW // BS + 2 and bm.num_used_blocks == len(held)
    assert len(s.block_table) == 50 and s.block_table[:45] == [null] * 45
    assert bm.take_window_releases() == []  # nothing to madvise: the blocks themselves came back
    bm.free(s)
    assert bm.num_free_blocks == 7 and all(b.ref_count == 0 for b in bm.blocks)


def test_every_layer_windowed_a_shared_block_stays_until_its_last_holder_passes_it():
    bm = BlockManager(32, BS, window=WINDOW, reuse_passed=True)
    null = bm.null_block_id
    prompt = list(range(12))
    a = seq(prompt + [100] * 20, 0)
    compute(bm, a, 12)  # at 12 (a boundary) queries read keys 5..: block 0 dropped, free and cached
    assert a.block_table[0] == null and bm.num_used_blocks == 2
    shared = a.block_table[1:3]
    b = seq(prompt + [200], 1)
    assert bm.allocate_cached_prefix(b) == 12  # all three hit; b drops block 0 again at once
    assert b.block_table == [null, *shared] and [bm.blocks[x].ref_count for x in shared] == [2, 2]
    compute(bm, a, 10)  # a at 22 (boundary 20, reading 13..) passed blocks 1 and 2: b still holds them
    assert a.block_table[:3] == [null] * 3 and [bm.blocks[x].ref_count for x in shared] == [1, 1]
    bm.free(b)
    assert [bm.blocks[x].ref_count for x in shared] == [0, 0] and all(x in bm.free_block_ids for x in shared)
    # freed with their K/V and hashes: the same conversation again hits every full block
    again = seq(list(a.token_ids[:22]) + [5], 2)
    bm.free(a)
    assert bm.allocate_cached_prefix(again) == 20
    assert sum(x != null for x in again.block_table) == 2  # only its window's blocks (3 and 4) held
    bm.free(again)
    assert all(b.ref_count == 0 for b in bm.blocks) and bm.num_free_blocks == 31


def test_reuse_passed_needs_a_window_and_a_block_to_spare():
    with pytest.raises(ValueError, match="window"):
        BlockManager(8, BS, reuse_passed=True)
    with pytest.raises(ValueError, match="num_blocks >= 2"):
        BlockManager(1, BS, window=WINDOW, reuse_passed=True)
