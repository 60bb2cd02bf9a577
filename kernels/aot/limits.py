"""The GPUs the kernels are compiled for, their limits, and the occupancy each kernel must reach.

A kernel passes when it compiles, spills nothing (no stack frame: spills live there, and so would
a register array indexed at run time), fits the per-block shared-memory limit, and keeps enough
warps resident per SM. The register bound is that occupancy target: a kernel may use as many
registers as still lets ``min_warps`` warps sit on one SM (65536 registers / SM, allocated per
warp in units of 256), so the bound is min(255, 65536 / (32 x min_warps)) rounded to the
allocation unit, tightened by shared memory when a kernel also uses that.

Why these targets (per SM; 64 warps is the hardware maximum):
  * 32 warps (50%): the elementwise kernels (RMSNorm, RoPE, SiLU x up, KV store, the sampler's
    draw, the split-KV reduce) issue plain loads and stall at first use, so latency is hidden only
    by other warps. Little's law: 4.8 TB/s x ~0.7 us of DRAM latency / 132 SMs = ~25 KB in flight
    per SM; at 16-32 B per thread per load batch that takes 25-50 warps. Bound: 64 registers.
  * 16 warps (25%): decode attention (BLOCK_M = 16). Its K/V tiles are software-pipelined
    through shared memory (cp.async, num_stages = 3: two tiles in flight per program), so 4
    programs of 4 warps keep 8 tiles of 4-16 KB in flight, above the ~25 KB needed. Bound: 128.
  * 8 warps (12.5%): prefill attention (BLOCK_M = 32-64), bound by tensor-core math, not latency:
    FlashAttention-2 runs one or two 4-8-warp programs per SM. Bound: 255 (the ISA maximum).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.launch import A100, H200, Target

REGS_PER_SM = 65536
REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256 (8 per thread)
MAX_REGS_PER_THREAD = 255
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
SMEM_RESERVED_PER_BLOCK = 1024  # the CUDA runtime keeps 1 KB of shared memory per block (sm_80+)


@dataclass(frozen=True)
class Gpu:
    arch: str  # compile target
    name: str
    target: Target  # SM count, for the launch plans (split-KV)
    smem_per_sm: int  # bytes of shared memory per SM
    smem_per_block: int  # the opt-in maximum one block may use


GPUS = (
    Gpu("sm_90", "H100/H200", H200, smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    Gpu("sm_80", "A100", A100, smem_per_sm=164 * 1024, smem_per_block=163 * 1024),
)
BY_ARCH = {gpu.arch: gpu for gpu in GPUS}


def min_warps(kernel: str, meta: dict) -> int:
    """Resident warps per SM the kernel needs (see the module docstring for why)."""
    if kernel == "_paged_attention_kernel":
        return 16 if meta["BLOCK_Q"] * meta["GROUP_PAD"] <= 16 else 8
    return 32


def register_bound(warps_needed: int) -> int:
    per_warp = REGS_PER_SM // warps_needed // REG_ALLOC_UNIT * REG_ALLOC_UNIT
    return min(MAX_REGS_PER_THREAD, per_warp // 32)


def resident_warps(regs: int, smem: int, num_warps: int, gpu: Gpu) -> tuple[int, str]:
    """Warps of this kernel that fit on one SM, and what limits them ("regs", "smem", "warps")."""
    regs_per_warp = -(-max(regs, 1) * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    limits = {
        "regs": REGS_PER_SM // regs_per_warp // num_warps,
        "smem": gpu.smem_per_sm // (smem + SMEM_RESERVED_PER_BLOCK),
        "warps": min(MAX_WARPS_PER_SM // num_warps, MAX_BLOCKS_PER_SM),
    }
    limiter = min(limits, key=limits.get)
    return limits[limiter] * num_warps, limiter


def violations(kernel: str, meta: dict, num_warps: int, resources, gpu: Gpu) -> list[str]:
    """Why this compiled kernel fails the gate; empty when it passes."""
    if resources.error:
        return [f"does not compile: {resources.error}"]
    found = []
    if resources.spill_stores or resources.spill_loads:
        found.append(f"spills {resources.spill_stores} B stores / {resources.spill_loads} B loads per thread")
    if resources.stack:
        found.append(f"uses a {resources.stack} B stack frame (local memory)")
    if resources.smem > gpu.smem_per_block:
        found.append(f"needs {resources.smem} B of shared memory, over {gpu.name}'s {gpu.smem_per_block} B per block")
    need = min_warps(kernel, meta)
    have, limiter = resident_warps(resources.regs, resources.smem, num_warps, gpu)
    if have < need:
        found.append(f"only {have} warps/SM fit on {gpu.name} (limited by {limiter}: {resources.regs} registers, "
                     f"{resources.smem} B shared); needs {need} (at most {register_bound(need)} registers)")
    return found
