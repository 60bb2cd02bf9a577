"""The weight layout of ``quant_matmul`` (csrc/quant_matmul.cpp): block codes interleaved 16 rows wide.

A weight is N rows of K codes with a (scale, offset) per 32-wide block of a row:
w[n, 32 b + i] = scale[n, b] * code[n, b, i] + offset[n, b]. The kernel wants, for each group g of 16
output rows and each block b, vectors of 64 bytes holding 4 consecutive codes of each of the 16
rows (so one 32-bit lane of a VNNI dot product is one output row):

    bits 8: codes[g, b, j, r, i] = code[16 g + r, b, 4 j + i]                                   j < 8
    bits 4: codes[g, b, j, r, i] = code[16 g + r, b, 4 j + i] | code[16 g + r, b, 16 + 4 j + i] << 4   j < 4
    scale[g, b, r], offset[g, b, r]  (fp16 when every value is exactly an fp16, else fp32)

GGUF stores Q4_0/1, Q5_0/1 and Q8_0 block scales and mins as fp16, so they stay 2 bytes each (a
Q4_1 weight costs 0.625 bytes, not 0.75 with fp32 scales: at one row the step is bound by reading
them); the K types' d * sc products need fp32. N is padded to a multiple of 16 with zero rows; the kernel writes only the first N outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
GROUP_ROWS = 16


@dataclass
class PackedWeight:
    codes: torch.Tensor  # [G, nb, 4 or 8, 16, 4] uint8, flattened
    scale: torch.Tensor  # [G, nb, 16] fp16 or fp32
    offset: torch.Tensor  # [G, nb, 16] same dtype as scale
    bits: int  # 4 or 8
    rows: int  # N
    cols: int  # K

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.offset))


def pack(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int) -> PackedWeight:
    """codes [N, K] uint8 (< 2^bits), scale and offset [N, K / 32] -> the kernel's layout."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    n, k = codes.shape
    if k % BLOCK or scale.shape != (n, k // BLOCK) or offset.shape != scale.shape:
        raise ValueError(f"codes {list(codes.shape)} need K % 32 == 0 and scale/offset of shape [{n}, {k // BLOCK}]")
    nb, groups = k // BLOCK, -(-n // GROUP_ROWS)
    pad = groups * GROUP_ROWS - n
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad, k)])
        scale, offset = (torch.cat([t, t.new_zeros(pad, nb)]) for t in (scale, offset))
    c = codes.view(groups, GROUP_ROWS, nb, BLOCK)
    if bits == 4:
        c = c.view(groups, GROUP_ROWS, nb, 2, 4, 4).permute(0, 2, 3, 4, 1, 5)  # [G, nb, half, j, r, i]
        packed = c[:, :, 0] | (c[:, :, 1] << 4)  # [G, nb, 4, 16, 4]
    else:
        packed = c.view(groups, GROUP_ROWS, nb, 8, 4).permute(0, 2, 3, 1, 4)  # [G, nb, 8, 16, 4]

    exact_half = all(torch.equal(t.float().half().float(), t.float()) for t in (scale, offset))
    dtype = torch.float16 if exact_half else torch.float32

    def by_group(t: torch.Tensor) -> torch.Tensor:  # [N', nb] -> [G, nb, 16]
        return t.float().to(dtype).view(groups, GROUP_ROWS, nb).transpose(1, 2).contiguous()

    return PackedWeight(packed.contiguous().view(-1), by_group(scale), by_group(offset), bits, n, k)


def unpack_rows(w: PackedWeight, ids: torch.Tensor) -> torch.Tensor:
    """The dequantized rows ids [T] of w -> [T, K] fp32 (embedding lookups of a quantized table)."""
    nb, vectors = w.cols // BLOCK, 4 if w.bits == 4 else 8
    g, r = ids // GROUP_ROWS, ids % GROUP_ROWS
    packed = w.codes.view(-1, nb, vectors, GROUP_ROWS, 4)[g, :, :, r]  # [T, nb, vectors, 4]
    if w.bits == 4:
        codes = torch.cat([packed & 0x0F, packed >> 4], dim=2)  # [T, nb, 8, 4]: weights 0-15, then 16-31
    else:
        codes = packed
    codes = codes.reshape(-1, nb, BLOCK).float()
    scale = w.scale[g, :, r].float()[:, :, None]  # [T, nb, 1]
    offset = w.offset[g, :, r].float()[:, :, None]
    return (codes * scale + offset).view(-1, w.cols)
