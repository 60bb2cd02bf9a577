"""GGUF 4-bit blocks (Q4_0, Q4_1) kept as 4-bit codes instead of dequantized to fp32.

A GGUF Q4 block holds 32 weights of one row: an fp16 scale d (and for Q4_1 an fp16 min m) and 32
4-bit codes, low nibbles first (weights 0-15), then high nibbles (16-31):

    Q4_0: w = d * (q - 8)        18 bytes per block
    Q4_1: w = d * q + m          20 bytes per block

Both are w = scale * q + offset with a per-block (scale, offset), which is exactly what torch's
CPU int4 matmul takes (models/linear.py), so the served weights are the file's weights with no
requantization. Decoding here is checked against gguf.quants.dequantize in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # weights per block, for both types
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


@dataclass
class Q4Weight:
    """A [N, K] weight as 4-bit codes with a (scale, offset) per 32-wide block of each row."""

    codes: torch.Tensor  # [N, K] uint8, 0..15
    scale: torch.Tensor  # [N, K / 32] fp32
    offset: torch.Tensor  # [N, K / 32] fp32

    def dequantize(self) -> torch.Tensor:  # [N, K] fp32, the same values gguf.quants.dequantize gives
        n, k = self.codes.shape
        blocks = self.codes.view(n, k // GROUP, GROUP).float()
        return (blocks * self.scale[:, :, None] + self.offset[:, :, None]).view(n, k)

    def map_rows(self, fn) -> Q4Weight:
        """Apply the same row permutation to codes, scales and offsets (e.g. undoing llama.cpp's q/k order)."""
        return Q4Weight(fn(self.codes), fn(self.scale), fn(self.offset))

    @staticmethod
    def cat(parts: list[Q4Weight]) -> Q4Weight:
        """Rows of several weights stacked, as for the fused qkv and gate|up projections."""
        return Q4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "offset")))


def decode_gguf_q4(kind: str, data: np.ndarray, rows: int, cols: int) -> Q4Weight | None:
    """A GGUF tensor's raw bytes -> Q4Weight, or None when it is not a 4-bit type we keep."""
    if kind not in _BLOCK_BYTES or cols % GROUP:
        return None
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(rows, cols // GROUP, _BLOCK_BYTES[kind])
    scale = torch.from_numpy(raw[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    if kind == "Q4_1":
        offset = torch.from_numpy(raw[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        packed = raw[:, :, 4:]
    else:
        offset = -8.0 * scale
        packed = raw[:, :, 2:]
    nibbles = torch.from_numpy(packed.copy())  # [N, K/32, 16]
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).reshape(rows, cols)  # low nibbles first
    return Q4Weight(codes.contiguous(), scale.contiguous(), offset.contiguous())
