"""Rotary position embedding reference, HF "rotate_half" (non-interleaved) layout.

    inv_freq[j] = 1 / theta^(2j / D)              j < D/2, computed in fp32 exactly as HF does
    f = pos * inv_freq;  cache row = cat(cos f, sin f)                         [max_pos, D]
    x1, x2 = x[..., :D/2], x[..., D/2:]
    out = cat(x1*cos - x2*sin, x2*cos + x1*sin)   (= x*cos + rotate_half(x)*sin)

q [T, Hq, D] and k [T, Hk, D] are rotated in place at ``positions`` [T] int64.
"""

from __future__ import annotations

import torch


def build_cos_sin_cache(
    head_dim: int,
    max_positions: int,
    theta: float,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Return the [max_positions, head_dim] table cat(cos, sin) of the rotary angles."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    # Same expression and dtypes as transformers' default rope init, so the angles are bit-equal.
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)  # [D/2]
    positions = torch.arange(max_positions, device=device, dtype=torch.int64).float()  # [P]
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2] one fp32 product, like HF's k=1 matmul
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)  # [P, D]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, H, D]; cos, sin [T, 1, D/2] already in x.dtype (HF casts cos/sin to the activations dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def apply_rotary_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hk, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
) -> None:
    half = cos_sin_cache.shape[-1] // 2
    rows = cos_sin_cache[positions]  # [T, D]
    cos, sin = rows[:, None, :half], rows[:, None, half:]  # [T, 1, D/2] each
    q.copy_(_rotate(q, cos.to(q.dtype), sin.to(q.dtype)))
    k.copy_(_rotate(k, cos.to(k.dtype), sin.to(k.dtype)))
