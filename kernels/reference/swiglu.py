"""Gated-MLP activation references for x [T, 2F] (gate | up) -> out [T, F]:
SwiGLU silu(gate) * up (Llama, Qwen, Mistral) and GeGLU gelu_tanh(gate) * up (Gemma: transformers'
gelu_pytorch_tanh, the tanh approximation of GELU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # x [T, 2F] -> [T, F]
    half = x.shape[-1] // 2
    return F.silu(x[:, :half]) * x[:, half:]


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # x [T, 2F] -> [T, F]
    half = x.shape[-1] // 2
    return F.gelu(x[:, :half], approximate="tanh") * x[:, half:]
