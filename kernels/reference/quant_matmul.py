"""Reference of kernels/cpu quant_matmul: activations x block-quantized weights, in plain torch.

Weights: w[n, 32 b + i] = scale[n, b] * code[n, b, i] + offset[n, b] (weights/blocks.py). The
activations are quantized per 32-wide block of a row, as llama.cpp does for these formats:

    d[m, b] = max_i |x[m, 32 b + i]| / 127;   q[m, b, i] = round_half_even(x[m, 32 b + i] * (1 / d[m, b]))
    out[m, n] = sum_b scale[n, b] d[m, b] (sum_i code[n, b, i] q[m, b, i]) + offset[n, b] d[m, b] (sum_i q[m, b, i])

The integer sums are exact here (float64), so the C++ kernel may differ only by the order of its
fp32 accumulation. ``quantize_activations_ref`` mirrors the kernel's fp32 steps exactly (same
rounding decisions). Shapes: x [M, K]; codes [N, K] uint8; scale, offset [N, K/32] -> [M, N] fp32.
"""

from __future__ import annotations

import torch

BLOCK = 32


def quantize_activations_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K/32, 32] integer-valued fp32 in [-127, 127], d [M, K/32] fp32)."""
    m, k = x.shape
    xb = x.float().view(m, k // BLOCK, BLOCK)
    d = xb.abs().amax(dim=-1) / 127.0  # [M, nb]
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xb * inv[..., None]).clamp(-127, 127)  # torch.round: half to even, like the kernel
    return q, d


def quant_matmul_ref(
    x: torch.Tensor,  # [M, K]
    codes: torch.Tensor,  # [N, K] uint8
    scale: torch.Tensor,  # [N, K / 32]
    offset: torch.Tensor,  # [N, K / 32]
) -> torch.Tensor:  # [M, N] fp32
    q, d = quantize_activations_ref(x)
    n, k = codes.shape
    c = codes.double().view(n, k // BLOCK, BLOCK)
    dots = torch.einsum("mbi,nbi->mnb", q.double(), c)  # [M, N, nb] exact integer sums
    per_block = scale.double()[None] * d.double()[:, None] * dots + offset.double()[None] * (d.double() * q.double().sum(-1))[:, None]
    return per_block.sum(-1).float()
