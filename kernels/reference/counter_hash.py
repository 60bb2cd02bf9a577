"""Counter-based random numbers: a pure function of (seed, offset, vocab index).

Every value is kept in [0, 2^32) inside int64 and every multiply is split into 16-bit halves, so no
intermediate exceeds 2^49: torch (CPU or CUDA) and Triton compute bit-identical integers without
relying on integer overflow. The Triton twin lives in ``kernels/sampling.py`` (``_uniform``) and
follows this file line by line; the tests check the two agree bit for bit.

    key(seed, offset) = mix(seed_lo ^ mix(seed_hi ^ mix(offset_lo ^ mix(offset_hi ^ GOLDEN))))
    h(key, v)         = mix(key ^ mix((v + SALT) mod 2^32))
    u                 = (2 * (h >> 9) + 1) * 2^-24        an odd multiple of 2^-24, exact in fp32, in (0, 1)

``mix`` is Chris Wellons' "lowbias32" integer finalizer (two multiply-xorshift rounds).
"""

from __future__ import annotations

import torch

MASK16 = 0xFFFF
MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # 2^32 / phi, decorrelates the all-zero seed/offset
SALT = 0x632BE5AB  # keeps vocab index 0 away from the fixed point of mix at 0
MUL1 = 0x7FEB352D
MUL2 = 0x846CA68B


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32), without int64 overflow."""
    lo = x * (c & MASK16)  # < 2^48
    hi = ((x * (c >> 16)) & MASK16) << 16  # the high half only matters mod 2^16
    return (lo + hi) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mulmod32(x, MUL1)
    x = x ^ (x >> 15)
    x = _mulmod32(x, MUL2)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[B] int64 seeds and offsets -> [B] int64 keys in [0, 2^32)."""
    seeds, offsets = seeds.long(), offsets.long()
    key = mix32(((offsets >> 32) & MASK32) ^ GOLDEN)
    key = mix32((offsets & MASK32) ^ key)
    key = mix32(((seeds >> 32) & MASK32) ^ key)
    return mix32((seeds & MASK32) ^ key)


def uniforms(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B] keys -> [B, V] fp32 uniforms in (0, 1); row b depends only on keys[b]."""
    index = torch.arange(vocab_size, device=keys.device, dtype=torch.int64)  # [V]
    h = mix32(keys[:, None] ^ mix32((index + SALT) & MASK32)[None, :])  # [B, V]
    return ((h >> 9) * 2 + 1).float() * 2.0**-24
