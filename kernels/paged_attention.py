"""Paged attention Triton kernel: decode rows and chunked-prefill rows in one launch, GQA, split-KV.

Math (per sequence i, query row r of its q_len, position p = context_len - q_len + r):

    out[t, h] = sum_{p - W < n <= p} softmax_n(scale * q[t, h] . K[n, h // G]) V[n, h // G],   G = Hq // Hk
    K[n] = k_cache[block_tables[i, n // BS], n % BS]   (likewise V)

W is the layer's sliding window (``window`` > 0: each row sees its last W keys; 0: every key).

Shapes: q [T, Hq, D]; k_cache, v_cache [NB, BS, Hk, D]; block_tables [B, max_blocks] int32;
cu_seqlens_q [B+1] int32; context_lens [B] int32 -> out [T, Hq, D] (rows past cu_seqlens_q[-1]
are left unspecified).

Design (FlashAttention-2 style online softmax, fp32 accumulate, exp2 with log2(e) folded in):
  * A program owns one KV head and a tile of BLOCK_M = BLOCK_Q x GROUP_PAD rows: BLOCK_Q query
    tokens of ONE sequence times the G query heads sharing that KV head (padded to a power of 2),
    so each K/V tile is loaded once for the whole GQA group. Decode rows (q_len 1) use BLOCK_Q so
    that BLOCK_M = 16 (tl.dot's minimum), prefill-bearing batches use BLOCK_M = 64 (32 in fp32,
    whose IEEE dot runs on FMA units and needs more registers). Tile sizes, warps and stages come
    from `_tiles`, chosen from the AOT compile gate's register/spill report (docs/kernels.md).
  * No host sync: the grid has T // BLOCK_Q + B query tiles (an upper bound on
    sum_i ceil(q_len_i / BLOCK_Q)); a program finds its sequence by binary search over
    cu_seqlens_q[i] // BLOCK_Q + i and exits if its tile is past the sequence's q_len.
  * Keys are gathered BLOCK_N at a time through the block table (any page size BS), and the loop
    stops at the last key the tile's last query row can see (causal), so a decode row reads exactly
    its context and a prefill tile skips the future; with a window it starts at the first key the
    tile's first row can see, so a windowed decode row reads W keys whatever its context (and never
    the block-table entries before them: blocks the block manager may have window released).
  * Split-KV: with few (query tile, KV head) programs and long contexts the GPU would idle, so a
    third grid axis cuts each sequence's key range into num_splits chunks; each writes an
    unnormalised partial (acc, running max m, running sum l) and `_reduce_splits_kernel` merges
    them: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s. One split writes `out` directly
    and skips the reduce. The split count is a runtime argument (only "split or not" is a
    constexpr), so a GPU compiles 2 variants per tile shape instead of one per power of two.
  * Batch-dependent integers (num_seqs, group, num_splits, block-table and partial strides) are
    `do_not_specialize`: Triton would otherwise compile separate variants for a value of 1 or a
    multiple of 16 (one for B = 1, another for B = 16, ...), for no gain in the generated code.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch, Target, run
from kernels.reference.paged_attention import paged_attention_ref

__all__ = ["choose_num_splits", "paged_attention", "paged_attention_ref", "plan_paged_attention"]

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 32
_MIN_KEYS_PER_SPLIT = 256  # below this a split costs more in partial traffic than it hides


@triton.jit
def _find_sequence(cu_seqlens_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    # Largest i with cu_seqlens[i] // BLOCK_Q + i <= tile (the first tile index of sequence i).
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:  # fp32 operands: full precision instead of the default tf32
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit(do_not_specialize=["num_seqs", "group", "num_splits", "window", "stride_bt", "stride_ps", "stride_pt"])
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_ptr, context_lens_ptr,  # inputs
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,  # outputs (out, or the split partials)
    num_seqs, group, head_dim, block_size, qk_scale, num_splits,  # sizes; qk_scale = scale * log2(e)
    window,  # keys each row sees, itself included (read only when WINDOWED)
    stride_qt, stride_qh,  # q [T, Hq, D], head dim contiguous
    stride_cb, stride_cs, stride_ch, stride_cd,  # caches [NB, BS, Hk, D] (shared)
    stride_bt,  # block_tables row
    stride_ot, stride_oh,  # out [T, Hq, D], head dim contiguous
    stride_ps, stride_pt, stride_ph,  # partials: acc [S, T, Hq, D] and m, l [S, T, Hq] (same s/t/h)
    BLOCK_Q: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, FP32_IEEE: tl.constexpr, UPCAST: tl.constexpr,
    WINDOWED: tl.constexpr,  # a sliding-window layer (its own compile: global layers keep their registers)
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_sequence(cu_seqlens_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    local_tile = tile - (q_start // BLOCK_Q + seq)
    if local_tile * BLOCK_Q >= q_len:  # the grid over-provisions tiles; this one has no rows
        return
    context_len = tl.load(context_lens_ptr + seq)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_tok = local_tile * BLOCK_Q + offs_m // GROUP_PAD  # [BLOCK_M] token index within the sequence
    head = kv_head * group + offs_m % GROUP_PAD  # [BLOCK_M] query head
    row_ok = (q_tok < q_len) & (offs_m % GROUP_PAD < group)
    d_ok = offs_d < head_dim
    token = (q_start + q_tok).to(tl.int64)  # [BLOCK_M] row of q / out
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :], other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if UPCAST:  # the interpreter's tl.dot is wrong on bf16 operands (triton 3.9): multiply in fp32
        q = q.to(tl.float32)
    q_pos = context_len - q_len + q_tok  # [BLOCK_M] absolute position; sees keys q_pos - window + 1..q_pos

    # Causal: the tile's last row sees keys up to kv_end - 1, its first row none before kv_lo.
    kv_end = context_len - q_len + tl.minimum(q_len, (local_tile + 1) * BLOCK_Q)
    kv_lo = 0
    if WINDOWED:
        kv_lo = tl.maximum(context_len - q_len + local_tile * BLOCK_Q - window + 1, 0)
    if SPLIT:
        per_split = tl.cdiv(tl.cdiv(kv_end - kv_lo, num_splits), BLOCK_N) * BLOCK_N
        kv_start = kv_lo + split * per_split
        kv_stop = tl.minimum(kv_end, kv_start + per_split)
    else:
        kv_start = kv_lo
        kv_stop = kv_end

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the log2-scaled scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of 2^(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head.to(tl.int64) * stride_ch
    for n0 in range(kv_start, kv_stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        n_ok = offs_n < kv_stop
        page = tl.load(table_row + offs_n // block_size, mask=n_ok, other=0).to(tl.int64)
        kv_off = page * stride_cb + (offs_n % block_size) * stride_cs + head_off  # [BLOCK_N] int64
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :] * stride_cd, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = _dot(q, tl.trans(k), FP32_IEEE) * qk_scale  # [BLOCK_M, BLOCK_N]
        visible = n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if WINDOWED:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # p is rounded to the cache dtype, as on the GPU, before the P @ V product
        pv = _dot(p.to(v_cache_ptr.dtype.element_ty).to(v.dtype), v, FP32_IEEE)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    store_mask = row_ok[:, None] & d_ok[None, :]
    if not SPLIT:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty), mask=store_mask,
        )
    else:
        part = split.to(tl.int64) * stride_ps + token * stride_pt + head * stride_ph  # [BLOCK_M]
        tl.store(part_acc_ptr + part[:, None] * head_dim + offs_d[None, :], acc, mask=store_mask)
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_splits", "stride_ps", "stride_pt"])
def _reduce_splits_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr,  # pointers
    head_dim, num_splits,  # sizes
    stride_ps, stride_pt, stride_ph, stride_ot, stride_oh,  # strides (partials as in the main kernel)
    MAX_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    splits = tl.arange(0, MAX_SPLITS)
    s_ok = splits < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    part = splits.to(tl.int64) * stride_ps + token * stride_pt + head * stride_ph  # [MAX_SPLITS]
    m = tl.load(part_m_ptr + part, mask=s_ok, other=float("-inf"))  # -inf: no key seen (or no split)
    l_s = tl.load(part_l_ptr + part, mask=s_ok, other=0.0)
    acc_mask = s_ok[:, None] & (offs_d[None, :] < head_dim)
    acc = tl.load(part_acc_ptr + part[:, None] * head_dim + offs_d[None, :], mask=acc_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))  # [MAX_SPLITS]
    denom = tl.sum(w * l_s, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


def choose_num_splits(num_programs: int, max_context: int, target: Target) -> int:
    """Split-KV factor from shapes only (no host sync): fill ~2 waves of SMs, >= 256 keys a split."""
    if not target.compiled:
        return 1  # the interpreter runs programs one after another: splitting only adds work
    want = triton.cdiv(2 * target.num_sms, max(num_programs, 1))
    cap = max(1, max_context // _MIN_KEYS_PER_SPLIT)
    return min(triton.next_power_of_2(min(want, cap)), _MAX_SPLITS) if want > 1 and cap > 1 else 1


def _tiles(all_decode: bool, block_d: int, dtype: torch.dtype, target: Target) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): the largest tiles that compile without spills.

    From the AOT gate's sweeps over every supported head layout on sm_90 and sm_80 (the table in
    docs/kernels.md has the result): decode keeps 4 warps and halves BLOCK_N at D = 128 (BLOCK_N 64
    needs ~160 registers there, 32 needs 80-96). Prefill at D = 128 runs 4 warps, BLOCK_N 32 and 2
    stages: with 8 warps ptxas holds sm_80 programs to 128 registers and spills at GQA 1 and 8.
    fp32's IEEE dot runs on FMA units and needs far more registers than a tensor-core tile:
    BLOCK_N 16 and 2 stages for decode (BLOCK_N 32 takes 160-255 registers on sm_90), 32 x 32 tiles
    on 8 warps for prefill.
    """
    fp32 = dtype == torch.float32
    if block_d >= 256:  # Gemma's heads: half the rows per warp, or the [BLOCK_M, 256] accumulator spills
        return _wide_head_tiles(all_decode, fp32, target)
    if all_decode:
        block_m, block_n, num_warps, num_stages = (16, 16, 4, 2) if fp32 else (16, 64 if block_d <= 64 else 32, 4, 3)
    elif fp32:
        block_m, block_n, num_warps, num_stages = 32, 32, 8, 3
    else:
        block_m, block_n, num_warps, num_stages = (64, 64, 8, 3) if block_d <= 64 else (64, 32, 4, 2)
    if not target.compiled:
        block_n = 16  # the interpreter's cost is per element: smallest tiles
    return block_m, block_n, num_warps, num_stages


def _wide_head_tiles(all_decode: bool, fp32: bool, target: Target) -> tuple[int, int, int, int]:
    """D = 256 (Gemma 3), from the gate's sweeps on sm_90 and sm_80 (docs/kernels.md): the D <= 128
    tiles take 166-192 registers at decode and spill at prefill (a [64, 256] fp32 accumulator on 4
    warps), and fp32's 2-stage pipeline needs 50 KB of shared memory a program. 8 warps halve each
    thread's rows; one stage at decode and BLOCK_N 16 at prefill keep sm_80's bf16 programs off
    spills; fp32 runs 16 x 16 tiles on 8 warps, one stage."""
    if not target.compiled:
        return (16, 16, 4, 1) if all_decode else (32, 16, 4, 1)
    if fp32:
        return 16, 16, 8, 1
    return (16, 32, 8, 1) if all_decode else (32, 16, 8, 2)


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [NB, BS, Hk, D]
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
    window: int = 0,  # > 0: each row sees only its last `window` keys (sliding-window layers)
    num_splits: int | None = None,  # None: choose_num_splits; tests force it
) -> torch.Tensor:  # [T, Hq, D]
    target = Target.of(q.device)
    return run(*plan_paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, target,
                                     num_splits, window))


def plan_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float, target: Target, num_splits: int | None = None,
    window: int = 0,
) -> tuple[torch.Tensor, list[Launch]]:
    if window < 0:
        raise ValueError(f"window must be >= 0 (0 = every key), got {window}")
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(f"q must be [T, Hq, D] with a contiguous head dim, got {tuple(q.shape)}")
    n_tokens, n_q_heads, head_dim = q.shape
    if k_cache.dim() != 4 or k_cache.shape[3] != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches must be [NB, BS, Hk, {head_dim}], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError("k_cache and v_cache must share strides and q's dtype")
    n_kv_heads = k_cache.shape[2]
    if n_q_heads % n_kv_heads:
        raise ValueError(f"Hq={n_q_heads} must be a multiple of Hk={n_kv_heads}")
    n_seqs = block_tables.shape[0]
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.stride(1) != 1:
        raise ValueError("block_tables must be int32 [B, max_blocks] with contiguous rows")
    if cu_seqlens_q.shape != (n_seqs + 1,) or context_lens.shape != (n_seqs,):
        raise ValueError(f"cu_seqlens_q must be [{n_seqs + 1}] and context_lens [{n_seqs}]")
    if cu_seqlens_q.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("cu_seqlens_q and context_lens must be int32")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [T, Hq, D]
    if n_tokens == 0 or n_seqs == 0:
        return out, []

    group = n_q_heads // n_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K and N >= 16 on the GPU
    # T == B: an all-decode batch (known from shapes, no sync).
    block_m, block_n, num_warps, num_stages = _tiles(n_tokens == n_seqs, block_d, q.dtype, target)
    block_q = max(1, block_m // group_pad)
    n_tiles = n_tokens // block_q + n_seqs
    if num_splits is None:
        max_context = block_tables.shape[1] * k_cache.shape[1]
        if window:
            max_context = min(max_context, window + block_q)  # the keys a windowed tile reads
        num_splits = choose_num_splits(n_tiles * n_kv_heads, max_context, target)
    if not 1 <= num_splits <= _MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {_MAX_SPLITS}], got {num_splits}")
    if num_splits > 1:
        part_acc = torch.empty((num_splits, n_tokens, n_q_heads, head_dim), dtype=torch.float32, device=q.device)
        part_m = torch.empty((num_splits, n_tokens, n_q_heads), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused: one split stores straight to out
    upcast = not target.compiled and q.dtype != torch.float32  # interpreter: see UPCAST
    launches = [Launch(
        _paged_attention_kernel, (n_tiles, n_kv_heads, num_splits),
        (q, k_cache, v_cache, block_tables, cu_seqlens_q.contiguous(), context_lens.contiguous(),
         out, part_acc, part_m, part_l,
         n_seqs, group, head_dim, k_cache.shape[1], scale * _LOG2E, num_splits, window,
         q.stride(0), q.stride(1), *k_cache.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
         n_tokens * n_q_heads, n_q_heads, 1),
        dict(BLOCK_Q=block_q, GROUP_PAD=group_pad, BLOCK_N=block_n, BLOCK_D=block_d, SPLIT=num_splits > 1,
             FP32_IEEE=q.dtype == torch.float32 or upcast, UPCAST=upcast, WINDOWED=window > 0),
        num_warps=num_warps, num_stages=num_stages,
    )]
    if num_splits > 1:
        launches.append(Launch(
            _reduce_splits_kernel, (n_tokens, n_q_heads),
            (part_acc, part_m, part_l, out, head_dim, num_splits,
             n_tokens * n_q_heads, n_q_heads, 1, out.stride(0), out.stride(1)),
            dict(MAX_SPLITS=_MAX_SPLITS, BLOCK_D=block_d), num_warps=8 if block_d >= 256 else 4, num_stages=1,
        ))
    return out, launches
