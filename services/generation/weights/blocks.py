"""GGUF block-quantized tensors decoded to BlockWeight (models/block_weight.py): the file's integer codes, not fp32.

Every format kept here is, per block of 32 weights of one row, an affine map of unsigned codes:

    w[n, 32 b + i] = scale[n, b] * code[n, b, i] + offset[n, b]

    Q4_0  d * (q - 8)               code q (4 bit)   scale d          offset -8 d
    Q4_1  d * q + m                 code q (4 bit)   scale d          offset m
    Q4_K  d sc_j * q - dmin m_j     code q (4 bit)   scale d sc_j     offset -dmin m_j   (8 sub-blocks of 32 per 256)
    Q5_0  d * (q - 16)              code q (5 bit)   scale d          offset -16 d
    Q5_1  d * q + m                 code q (5 bit)   scale d          offset m
    Q5_K  d sc_j * q - dmin m_j     code q (5 bit)   like Q4_K with a fifth bit per weight
    Q8_0  d * x                     code x + 128     scale d          offset -128 d

so one kernel serves them all (kernels/cpu quant_matmul, with 4-bit or 8-bit code storage) and the
served weights are exactly the file's: nothing is requantized, ``BlockWeight.dequantize`` equals
gguf.quants.dequantize bit for bit (tested). Formats whose scales cover 16 weights (Q2_K, Q3_K, Q6_K)
or that are not affine (the IQ types) are not kept: they are dequantized and served dense.
"""

from __future__ import annotations

import numpy as np
import torch

from services.generation.models.block_weight import FOUR_BIT, GROUP, BlockWeight

_QK_K = 256  # weights per K-type super-block
EIGHT_BIT = ("Q5_0", "Q5_1", "Q5_K", "Q8_0")
KEPT = FOUR_BIT + EIGHT_BIT
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176}


def _f16(raw: np.ndarray) -> torch.Tensor:
    """[..., 2] uint8 little-endian fp16 -> [...] fp32."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """[..., 16] packed bytes -> [..., 32] codes: low nibbles are weights 0-15, high nibbles 16-31."""
    return torch.from_numpy(np.concatenate([qs & 0x0F, qs >> 4], axis=-1))  # numpy: ~10x torch's uint8 ops here


def _high_bits(qh: np.ndarray) -> torch.Tensor:
    """[..., 4] bytes = one little-endian uint32 -> [..., 32] its bits 0..31 (weight i gets bit i)."""
    bits = torch.from_numpy(np.ascontiguousarray(qh)).long()  # [..., 4]
    word = bits[..., 0] | bits[..., 1] << 8 | bits[..., 2] << 16 | bits[..., 3] << 24
    return ((word[..., None] >> torch.arange(32)) & 1).to(torch.uint8)


def _k_scales(scales: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., 12] packed 6-bit scales and mins of the 8 sub-blocks -> ([..., 8], [..., 8]) as floats."""
    s = torch.from_numpy(np.ascontiguousarray(scales)).view(*scales.shape[:-1], 3, 4)
    d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float(), mn.float()


def decode_gguf_blocks(kind: str, data: np.ndarray, rows: int, cols: int) -> BlockWeight | None:
    """A GGUF tensor's raw bytes -> BlockWeight, or None when its type is not kept as codes."""
    if kind not in KEPT or cols % (_QK_K if kind.endswith("_K") else GROUP):
        return None
    per_row = cols // (_QK_K if kind.endswith("_K") else GROUP)
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(rows, per_row, _BLOCK_BYTES[kind])
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        d = _f16(raw[..., 0:2])  # [N, nb]
        has_min = kind.endswith("_1")
        rest = raw[..., 4:] if has_min else raw[..., 2:]
        if kind.startswith("Q5"):
            codes = _nibbles(rest[..., 4:]) | (_high_bits(rest[..., :4]) << 4)
            offset = _f16(raw[..., 2:4]) if has_min else -16.0 * d
        else:
            codes = _nibbles(rest)
            offset = _f16(raw[..., 2:4]) if has_min else -8.0 * d
        scale = d
    elif kind == "Q8_0":
        scale = _f16(raw[..., 0:2])
        codes = (torch.from_numpy(raw[..., 2:].copy()).view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        offset = -128.0 * scale
    else:  # Q4_K, Q5_K: super-blocks of 8 sub-blocks of 32
        d, dmin = _f16(raw[..., 0:2]), _f16(raw[..., 2:4])  # [N, nsb]
        sc, mn = _k_scales(raw[..., 4:16])  # [N, nsb, 8]
        qs = raw[..., -128:].reshape(rows, per_row, 4, 32)  # 4 chunks of 32 bytes = sub-blocks 2c (low) and 2c+1 (high)
        codes = torch.from_numpy(np.stack([qs & 0x0F, qs >> 4], axis=3)).reshape(rows, per_row, 8, 32)
        if kind == "Q5_K":
            qh = torch.from_numpy(np.ascontiguousarray(raw[..., 16:48]))  # [N, nsb, 32]: bit j -> sub-block j
            codes = codes | (((qh[:, :, None, :] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1) << 4)
        scale = d[..., None] * sc  # [N, nsb, 8], the same fp32 product gguf computes
        offset = -(dmin[..., None] * mn)
    return BlockWeight(kind, codes.reshape(rows, cols).contiguous(), scale.reshape(rows, -1).contiguous(),
                       offset.reshape(rows, -1).contiguous())
