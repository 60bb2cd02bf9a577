"""A block-quantized weight as the model computes with it: integer codes, a scale and an offset per block.

    w[n, 32 b + i] = scale[n, b] * code[n, b, i] + offset[n, b]

The Quantized projection (models/linear.py) serves these codes through kernels/cpu's quant_matmul.
The type lives with the model, not with the GGUF decoding that fills it (weights/blocks.py), so
weights/ imports models/ and never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32  # weights per block (sub-block for the K types)
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # kept in 4-bit code storage; every other kept type in 8-bit


@dataclass
class BlockWeight:
    """A [N, K] weight as codes with a (scale, offset) per 32-wide block of each row."""

    kind: str  # the GGUF type(s), e.g. "Q4_1"; "Q4_1+Q8_0" after cat of different types
    codes: torch.Tensor  # [N, K] uint8
    scale: torch.Tensor  # [N, K / 32] fp32
    offset: torch.Tensor  # [N, K / 32] fp32

    @property
    def bits(self) -> int:
        """Code width the kernel stores: 4 when every part is a 4-bit type, else 8."""
        return 4 if all(k in FOUR_BIT for k in self.kind.split("+")) else 8

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    def dequantize(self) -> torch.Tensor:  # [N, K] fp32, the values gguf.quants.dequantize gives
        n, k = self.codes.shape
        blocks = self.codes.view(n, k // GROUP, GROUP).float()
        return (blocks * self.scale[:, :, None] + self.offset[:, :, None]).view(n, k)

    def map_rows(self, fn) -> BlockWeight:
        """Apply the same row permutation to codes, scales and offsets (e.g. undoing llama.cpp's q/k order)."""
        return BlockWeight(self.kind, fn(self.codes), fn(self.scale), fn(self.offset))

    @staticmethod
    def cat(parts: list[BlockWeight]) -> BlockWeight:
        """Rows of several weights stacked, as for the fused qkv and gate|up projections."""
        kinds = "+".join(sorted({k for p in parts for k in p.kind.split("+")}))
        return BlockWeight(kinds, *(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "offset")))
