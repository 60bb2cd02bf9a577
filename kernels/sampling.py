"""Sampling: temperature / top-k / top-p / min-p with a per-request seed (see reference/sampling.py).

Choice: a HYBRID path. The filters stay in torch (``apply_sampling_filters``, shared with the
reference) because top-k / top-p need a per-row sort over V (49k-128k): torch.sort is a tuned
segmented radix sort that Triton has no primitive for, and the filters run only when some row asks
for them (none do by default). The draw, which runs for every row at every step, is this Triton
kernel: one pass over the [B, V] logits that fuses temperature scaling, counter-based Gumbel noise
and the arg-max, so no [B, V] noise or probability tensor is ever written.

    token[b] = argmax_v logits[b, v]                                   if temperature[b] == 0
             = argmax_v logits[b, v] / temperature[b] - log(-log(u(seed_b, offset_b, v)))   otherwise

u is ``kernels.reference.counter_hash`` computed here in int64 with the same 16-bit split multiplies:
the integers, hence the uniforms, are bit-identical to torch's, and a row's draw depends only on
(seed, offset, v), never on its batch-mates. Arg-max ties resolve to the lowest index, like torch.
The token itself matches the torch reference unless two scores differ by about an ulp of log().

Shapes: logits [B, V] fp32; temperature, top_p, min_p [B] fp32; top_k [B] int; seeds, offsets [B]
int64 -> tokens [B] int64. One program per row; BLOCK lanes each keep a running (best, index).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import Launch, Target, run
from kernels.reference.counter_hash import GOLDEN, MUL1, MUL2, SALT
from kernels.reference.sampling import apply_sampling_filters, sample_ref

__all__ = ["counter_uniforms", "plan_draw", "sample", "sample_ref"]

_BLOCK = 1024
# 32-bit constants enter the kernel as 16-bit halves so every literal is a small int (no uint32
# literal promotion surprises) and all arithmetic stays in int64. They must be tl.constexpr
# instances: the compiler rejects a global merely annotated `x: tl.constexpr = ...` (the
# interpreter does not; the AOT compile gate found it).
_MUL1_HI = tl.constexpr(MUL1 >> 16)
_MUL1_LO = tl.constexpr(MUL1 & 0xFFFF)
_MUL2_HI = tl.constexpr(MUL2 >> 16)
_MUL2_LO = tl.constexpr(MUL2 & 0xFFFF)
_GOLDEN_HI = tl.constexpr(GOLDEN >> 16)
_GOLDEN_LO = tl.constexpr(GOLDEN & 0xFFFF)
_SALT_HI = tl.constexpr(SALT >> 16)
_SALT_LO = tl.constexpr(SALT & 0xFFFF)


@triton.jit
def _low32(x):  # x mod 2^32 for any int64 x (arithmetic shift floors, so negatives work too)
    return x - ((x >> 32) << 32)


@triton.jit
def _mulmod32(x, c_hi: tl.constexpr, c_lo: tl.constexpr):  # (x * c) mod 2^32, x in [0, 2^32)
    return _low32(x * c_lo + (((x * c_hi) & 0xFFFF) << 16))


@triton.jit
def _mix32(x):  # lowbias32, as kernels.reference.counter_hash.mix32
    x = x ^ (x >> 16)
    x = _mulmod32(x, _MUL1_HI, _MUL1_LO)
    x = x ^ (x >> 15)
    x = _mulmod32(x, _MUL2_HI, _MUL2_LO)
    return x ^ (x >> 16)


@triton.jit
def _row_key(seed, offset):  # int64 scalars -> int64 key in [0, 2^32), as counter_hash.row_keys
    golden = (tl.full([], _GOLDEN_HI, tl.int64) << 16) | _GOLDEN_LO
    key = _mix32(_low32(offset >> 32) ^ golden)
    key = _mix32(_low32(offset) ^ key)
    key = _mix32(_low32(seed >> 32) ^ key)
    return _mix32(_low32(seed) ^ key)


@triton.jit
def _uniform(key, index):  # index: int64 vector -> fp32 uniforms in (0, 1), as counter_hash.uniforms
    salt = (tl.full([], _SALT_HI, tl.int64) << 16) | _SALT_LO
    h = _mix32(key ^ _mix32(_low32(index + salt)))
    return ((h >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08  # * 2^-24, exact


@triton.jit
def _sample_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, offsets_ptr, tokens_ptr,  # pointers
    vocab_size, stride_row,  # sizes, strides
    BLOCK: tl.constexpr,  # meta
):
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int64)
    if temperature > 0.0:
        key = _row_key(tl.load(seeds_ptr + row).to(tl.int64), tl.load(offsets_ptr + row).to(tl.int64))
        for start in range(0, vocab_size, BLOCK):
            idx = start + lanes
            logit = tl.load(logits_ptr + row * stride_row + idx, mask=idx < vocab_size, other=float("-inf"))
            gumbel = -tl.log(-tl.log(_uniform(key, idx)))
            score = logit / temperature + gumbel
            better = score > best  # strict: a lane keeps its earliest index on ties
            best = tl.where(better, score, best)
            best_idx = tl.where(better, idx, best_idx)
    else:
        for start in range(0, vocab_size, BLOCK):
            idx = start + lanes
            logit = tl.load(logits_ptr + row * stride_row + idx, mask=idx < vocab_size, other=float("-inf"))
            better = logit > best
            best = tl.where(better, logit, best)
            best_idx = tl.where(better, idx, best_idx)
    top = tl.max(best, axis=0)
    # Lanes hold indices from different chunks, so take the smallest index among the maxima.
    token = tl.min(tl.where(best == top, best_idx, vocab_size), axis=0)
    tl.store(tokens_ptr + row, token)


@triton.jit
def _uniforms_kernel(seeds_ptr, offsets_ptr, out_ptr, vocab_size, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    key = _row_key(tl.load(seeds_ptr + row).to(tl.int64), tl.load(offsets_ptr + row).to(tl.int64))
    tl.store(out_ptr + row * vocab_size + idx, _uniform(key, idx), mask=idx < vocab_size)


def counter_uniforms(seeds: torch.Tensor, offsets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The [B, V] uniforms the kernel draws with (to check them against counter_hash bit for bit)."""
    out = torch.empty((seeds.shape[0], vocab_size), dtype=torch.float32, device=seeds.device)
    block = min(_BLOCK, triton.next_power_of_2(vocab_size))
    _uniforms_kernel[(seeds.shape[0], triton.cdiv(vocab_size, block))](
        seeds.long().contiguous(), offsets.long().contiguous(), out, vocab_size, BLOCK=block
    )
    return out


def sample(
    logits: torch.Tensor,  # [B, V] fp32
    temperature: torch.Tensor,  # [B]
    top_k: torch.Tensor,  # [B] int, 0 = off
    top_p: torch.Tensor,  # [B], 1 = off
    min_p: torch.Tensor,  # [B], 0 = off
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
) -> torch.Tensor:  # [B] int64
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be fp32 [B, V] with a contiguous last dim, got {logits.dtype} {tuple(logits.shape)}")
    n_rows, vocab_size = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                    ("seeds", seeds), ("offsets", offsets)):
        if t.shape != (n_rows,):
            raise ValueError(f"{name} must be [{n_rows}], got {tuple(t.shape)}")
    if n_rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    filtered = apply_sampling_filters(logits, temperature, top_k, top_p, min_p)  # [B, V]
    return run(*plan_draw(filtered, temperature, seeds, offsets, Target.of(logits.device)))


def plan_draw(
    logits: torch.Tensor,  # [B, V] fp32, filtered (masked entries -inf)
    temperature: torch.Tensor,  # [B]
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
    target: Target,
) -> tuple[torch.Tensor, list[Launch]]:  # tokens [B] int64
    n_rows, vocab_size = logits.shape
    tokens = torch.empty(n_rows, dtype=torch.int64, device=logits.device)
    launch = Launch(
        _sample_kernel, (n_rows,),
        (logits, temperature.float().contiguous(), seeds.long().contiguous(), offsets.long().contiguous(), tokens,
         vocab_size, logits.stride(0)),
        dict(BLOCK=min(_BLOCK, triton.next_power_of_2(vocab_size))), num_warps=4, num_stages=1,
    )
    return tokens, [launch]
