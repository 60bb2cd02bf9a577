"""The model's projections: a dense weight, or a GGUF 4-bit weight through torch's int4 matmul.

    Dense(w)(x)  = x @ w.T                              any device / dtype
    Int4(q4)(x)  = x @ (scale * q + offset).T           CPU, bf16 activations (--quantization gguf)

Int4 is for steps of few rows (decode), which are bound by reading weights; its kernel's cost grows
linearly with rows, so above DENSE_ABOVE_ROWS (prefill chunks, large decode batches) it switches to
a dense bf16 copy of the same dequantized weight. Measured for all 120 projections of the default
model, 2 threads: 16 rows 26.9 (int4) vs 28.7 ms (dense), 32 rows 49.0 vs 35.9, 512 rows 787 vs 330.

Int4 keeps the file's 4-bit codes (a quarter of bf16's bytes per step) and feeds them to
``torch._weight_int4pack_mm_for_cpu``, which computes w = (q - 8) * s + z per 32-wide group: the
GGUF block's w = d * q + m is that with s = d, z = m + 8 d, so nothing is requantized. Only the
per-group s and z are rounded, to bf16, which the kernel requires with bf16 activations. That op
is private torch API: it is pinned with torch (requirements.txt) and tested against Dense.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.generation.weights.q4 import GROUP, Q4Weight


class Dense:
    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # [N, K]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, N]
        return F.linear(x, self.weight)


DENSE_ABOVE_ROWS = 24


class Int4:
    def __init__(self, q4: Q4Weight, dtype: torch.dtype = torch.bfloat16):
        if dtype != torch.bfloat16:
            # The fp32 variant of the kernel exists but runs ~25x slower than bf16 here (measured).
            raise ValueError("4-bit GGUF weights run with bfloat16 activations only (--dtype bfloat16)")
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q4.codes.to(torch.int32), 1)
        zero = q4.offset + 8.0 * q4.scale  # the kernel subtracts 8 from every code
        self.scales_and_zeros = torch.stack([q4.scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)  # [K/32, N, 2]
        self.dense = q4.dequantize().to(dtype)  # [N, K] for many-row steps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] bf16 -> [T, N] bf16
        if x.shape[0] > DENSE_ABOVE_ROWS:
            return F.linear(x, self.dense)
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_and_zeros)
