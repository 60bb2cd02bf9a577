"""Rotary position embedding reference, HF "rotate_half" (non-interleaved) layout.

    inv_freq[j] = 1 / theta^(2j / D)              j < D/2, computed in fp32 exactly as HF does
                  then, for Llama 3.x, HF's "llama3" scaling of the long wavelengths, or a GGUF's
                  rope_freqs divisors (llama.cpp's form of the same scaling)
    f = pos * inv_freq;  cache row = cat(cos f, sin f)                         [max_pos, D]
    x1, x2 = x[..., :D/2], x[..., D/2:]
    out = cat(x1*cos - x2*sin, x2*cos + x1*sin)   (= x*cos + rotate_half(x)*sin)

q [T, Hq, D] and k [T, Hk, D] are rotated in place at ``positions`` [T] int64.
"""

from __future__ import annotations

import math

import torch


def build_cos_sin_cache(
    head_dim: int,
    max_positions: int,
    theta: float,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    llama3: dict[str, float] | None = None,
    freq_factors: tuple[float, ...] | None = None,
) -> torch.Tensor:
    """Return the [max_positions, head_dim] table cat(cos, sin) of the rotary angles.

    llama3: HF's rope_parameters of rope_type "llama3" (factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings); freq_factors: a GGUF rope_freqs tensor, inv_freq divided by it.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    # Same expression and dtypes as transformers' default rope init, so the angles are bit-equal.
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)  # [D/2]
    if llama3:
        inv_freq = _llama3_inv_freq(inv_freq, **llama3)
    if freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(freq_factors, dtype=torch.float32, device=device)
    positions = torch.arange(max_positions, device=device, dtype=torch.int64).float()  # [P]
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2] one fp32 product, like HF's k=1 matmul
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)  # [P, D]


def _llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """transformers' _compute_llama3_parameters, op for op (so the angles are bit-equal): wavelengths
    longer than the original context / low_freq_factor are stretched by factor, those shorter than
    context / high_freq_factor kept, the band between interpolated."""
    old_context_len = original_max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def llama3_freq_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max_position_embeddings: int) -> list[float]:
    """What llama.cpp's converter writes as a Llama 3 GGUF's rope_freqs (LlamaModel.generate_extra_tensors):
    one divisor of inv_freq per frequency. Used to write test GGUFs."""
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    factors = []
    for j in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (j / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


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
