"""The model's projections and embedding table: dense weights, or a GGUF's own block-quantized codes.

    Dense(w, b)(x)     = x @ w.T (+ b)                             any device / dtype
    Quantized(w, b)(x) = x @ (scale * code + offset).T (+ b)       CPU, kernels/cpu quant_matmul
    Embedding(...)(ids) = the rows of a dense or quantized table

Quantized keeps the file's codes (4-bit or 8-bit storage, weights/blocks.py) in the kernel's
interleaved layout (kernels/cpu/packing.py) and multiplies them with the activations quantized per
32-wide block to int8, as llama.cpp does: a quarter (Q4) or half (Q8_0) of bf16's bytes per step
and integer dot products. It returns the activations' dtype. A tied LM head shares the embedding's
codes, so a Q8_0 token_embd serves both lookups and logits from one copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu
from services.generation.models.block_weight import BlockWeight


class Dense(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)  # [N, K]
        self.register_buffer("bias", bias, persistent=False)  # [N] or None (Qwen2's q/k/v only)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, N]
        return F.linear(x, self.weight, self.bias)


class Quantized(nn.Module):
    def __init__(self, blocks: BlockWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("bias", bias, persistent=False)  # [N] fp32 or None
        packed = cpu.pack(blocks.codes, blocks.scale, blocks.offset, blocks.bits)
        self.kind, self.bits, self.rows, self.cols = blocks.kind, packed.bits, packed.rows, packed.cols
        self.register_buffer("codes", packed.codes, persistent=False)
        self.register_buffer("scale", packed.scale, persistent=False)
        self.register_buffer("offset", packed.offset, persistent=False)

    @property
    def packed(self) -> cpu.PackedWeight:
        return cpu.PackedWeight(self.codes, self.scale, self.offset, self.bits, self.rows, self.cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, N] in x's dtype
        out = cpu.quant_matmul(x, self.packed)
        return (out if self.bias is None else out + self.bias).to(x.dtype)

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, K] fp32, dequantized
        return cpu.dequantize_rows(self.packed, ids)


Projection = Dense | Quantized


class Embedding(nn.Module):
    """Token id -> hidden vector, from a dense table or a Quantized one (then usually the tied head)."""

    def __init__(self, table: Projection, dtype: torch.dtype):
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        if isinstance(self.table, Quantized):
            return self.table.rows_of(ids).to(self.dtype)
        return F.embedding(ids, self.table.weight)
