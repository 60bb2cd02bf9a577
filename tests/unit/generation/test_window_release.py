"""The block manager's window release (sliding-window layers, block_manager.py): a block's windowed
K/V may go once every holder is more than the window past it, never earlier; a prefix-cache hit
never reuses a block whose windowed K/V its first query still reads."""

from services.generation.block_manager import BlockManager
from services.generation.sampling_params import SamplingParams
from services.generation.sequence import Sequence, Timing

WINDOW, BS = 8, 4  # a query at position p reads keys p - 7 .. p


def seq(tokens, seq_id=0):
    return Sequence(seq_id, seq_id, list(tokens), SamplingParams(), 0, Timing(0.0, 0.0))


def compute(bm, s, n):
    bm.allocate(s, n)
    s.num_computed_tokens += n
    bm.register_computed_blocks(s)
    bm.pass_window(s)


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
