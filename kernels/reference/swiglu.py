"""SwiGLU activation reference: out[T, F] = silu(x[:, :F]) * x[:, F:] for x [T, 2F] (gate | up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # x [T, 2F] -> [T, F]
    half = x.shape[-1] // 2
    return F.silu(x[:, :half]) * x[:, half:]
