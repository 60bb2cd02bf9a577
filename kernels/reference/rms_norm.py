"""RMSNorm reference (optionally fused with the residual add), as HF ``LlamaRMSNorm``.

    new_residual = x + residual                       (in x.dtype, like the model's residual add)
    out = weight * (h * rsqrt(mean(h^2, -1) + eps)).to(x.dtype),   h = new_residual.float()

x, residual: [T, H]; weight: [H]. Returns out [T, H], or (out, new_residual) with a residual.
"""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual  # [T, H] the new residual stream, rounded to the model dtype like HF
    h = x.float()
    variance = h.pow(2).mean(-1, keepdim=True)  # [T, 1]
    out = weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)  # HF casts before the weight
    return out if residual is None else (out, x)
