"""Triton paged attention against the torch reference: mixed decode/prefill batches, GQA, split-KV."""

from __future__ import annotations

import pytest
import torch
from conftest import HAS_CUDA
from paged_cases import make_paged_batch

from kernels.launch import H200, INTERPRETER
from kernels.paged_attention import choose_num_splits, paged_attention
from kernels.reference import paged_attention_ref

TOLERANCES = {
    # fp32 (IEEE dot): the online softmax reorders the sums and rescales by exp2 (an approximate
    # instruction on the GPU): ~10 ulps of O(1) outputs.
    torch.float32: (3e-5, 1e-4),
    # bf16: P is rounded to bf16 before P @ V (FlashAttention practice, as on the GPU) and the
    # output is rounded once; SDPA's bf16 math rounds differently. A few ulps of 2^-7.
    torch.bfloat16: (3e-2, 2e-2),
}

# (context_lens, q_lens): what the scheduler produces.
DECODE_ONLY = ([1, 17, 33, 100], [1, 1, 1, 1])  # T == B: the 16-row tile path
MIXED = ([5, 40, 17, 33, 1, 70], [1, 7, 17, 1, 1, 70])  # decode + a later chunk + whole prompts
LONG_CHUNK = ([90, 2], [75, 1])  # a chunk that spans several query tiles next to a decode row
SMALL_MIXED = ([5, 40, 17, 1], [1, 7, 17, 1])  # for split-KV: the interpreter pays per (token, head)

# (n_q_heads, n_kv_heads, head_dim, block_size): GQA 1 with non-power-of-2 heads and head dim,
# 3 (SmolLM2), 8.
HEADS = [(3, 3, 24, 16), (9, 3, 64, 32), (8, 1, 32, 16)]


def _check(batch, dtype, num_splits, device, window=0):
    batch = batch.to(device)
    got = paged_attention(*batch.args(), window, num_splits=num_splits)
    want = paged_attention_ref(*batch.args(), window)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize(("n_q_heads", "n_kv_heads", "head_dim", "block_size"), HEADS)
@pytest.mark.parametrize(("context_lens", "q_lens"), [DECODE_ONLY, MIXED], ids=["decode", "mixed"])
def test_paged_attention_fp32(triton_ops, n_q_heads, n_kv_heads, head_dim, block_size, context_lens, q_lens):
    batch = make_paged_batch(context_lens, q_lens, n_q_heads, n_kv_heads, head_dim, block_size)
    _check(batch, torch.float32, 1, triton_ops.device)


@pytest.mark.parametrize(("n_q_heads", "n_kv_heads", "head_dim", "block_size"), HEADS)
@pytest.mark.parametrize(("context_lens", "q_lens"), [DECODE_ONLY, SMALL_MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("num_splits", [2, 8])  # 8 splits leave some empty on short contexts
def test_paged_attention_split_kv(triton_ops, n_q_heads, n_kv_heads, head_dim, block_size, context_lens, q_lens, num_splits):
    batch = make_paged_batch(context_lens, q_lens, n_q_heads, n_kv_heads, head_dim, block_size)
    _check(batch, torch.float32, num_splits, triton_ops.device)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_paged_attention_chunk_spanning_tiles(triton_ops, num_splits):
    batch = make_paged_batch(*LONG_CHUNK, 4, 4, 16, 16)
    _check(batch, torch.float32, num_splits, triton_ops.device)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_paged_attention_bf16(triton_ops, num_splits):
    batch = make_paged_batch(*SMALL_MIXED, 9, 3, 64, 16, dtype=torch.bfloat16)
    _check(batch, torch.bfloat16, num_splits, triton_ops.device)


@pytest.mark.parametrize("window", [1, 5, 16, 40])
@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize(("context_lens", "q_lens"), [DECODE_ONLY, SMALL_MIXED, LONG_CHUNK], ids=["decode", "mixed", "chunk"])
def test_paged_attention_sliding_window(triton_ops, window, num_splits, context_lens, q_lens):
    """Windows shorter than, across and past the contexts; a chunk whose tiles start mid-window."""
    batch = make_paged_batch(context_lens, q_lens, 4, 2, 16, 4)
    _check(batch, torch.float32, num_splits, triton_ops.device, window)


def test_a_windowed_tile_never_reads_the_blocks_before_its_window(triton_ops):
    """Block-table entries before the window may be window released (block_manager.py): poisoned
    with NaN (and an out-of-range id), the output must not change."""
    batch = make_paged_batch([64, 50], [1, 9], 4, 2, 16, 4).to(triton_ops.device)
    want = paged_attention_ref(*batch.args(), 8)
    for seq, first_visible in ((0, 63 - 8 + 1), (1, 50 - 9 - 8 + 1)):
        for i in range(first_visible // 4):
            batch.k_cache[batch.block_tables[seq, i]] = float("nan")
        batch.block_tables[seq, : first_visible // 4 - 1] = 10**6
    torch.testing.assert_close(paged_attention(*batch.args(), 8, num_splits=2), want, atol=3e-5, rtol=1e-4)


def test_paged_attention_through_kernel_ops(triton_ops):
    batch = make_paged_batch(*MIXED, 6, 2, 16, 16).to(triton_ops.device)
    got = triton_ops.paged_attention(*batch.args())  # the automatic split choice
    torch.testing.assert_close(got, paged_attention_ref(*batch.args()), atol=3e-5, rtol=1e-4)


def test_choose_num_splits_is_one_off_gpu():
    assert choose_num_splits(1, 32768, INTERPRETER) == 1


def test_choose_num_splits_fills_the_gpu_from_shapes():
    assert choose_num_splits(3, 32768, H200) == 32  # 3 programs, 264 wanted: capped at 32 splits
    assert choose_num_splits(3, 1024, H200) == 4  # >= 256 keys a split
    assert choose_num_splits(300, 32768, H200) == 1  # 300 programs already fill 2 waves of 132 SMs
    assert choose_num_splits(100, 32768, H200) == 4  # ceil(264 / 100) = 3, rounded up to a power of two


def test_split_counts_need_not_be_powers_of_two():
    batch = make_paged_batch(*SMALL_MIXED, 4, 2, 16, 16)
    _check(batch, torch.float32, 3, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("n_q_heads", "n_kv_heads", "head_dim"), [(9, 3, 64), (32, 8, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paged_attention_gpu_serving_shapes(n_q_heads, n_kv_heads, head_dim, dtype):
    """Real model shapes: long decode rows (automatic split-KV) next to a 512-token prefill chunk."""
    context_lens = [4096, 1, 777, 2048, 1500, 600]
    q_lens = [1, 1, 1, 1, 512, 600]
    batch = make_paged_batch(context_lens, q_lens, n_q_heads, n_kv_heads, head_dim, 16, dtype=dtype)
    _check(batch, dtype, None, torch.device("cuda"))
    decode = make_paged_batch([8192, 300], [1, 1], n_q_heads, n_kv_heads, head_dim, 16, dtype=dtype)
    _check(decode, dtype, None, torch.device("cuda"))
