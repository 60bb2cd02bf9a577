"""Sampling reference: temperature / top-k / top-p / min-p with a per-request seed.

Per row b of logits [B, V] (fp32):
  * temperature[b] == 0: token = argmax(logits[b]) (first index on ties, like torch.argmax); filters
    and seed are ignored.
  * otherwise s = logits[b] / temperature[b], then the filters keep (ties at a threshold are kept):
      top-k (k > 0): the tokens with s >= the k-th largest s;
      top-p (p < 1): the smallest prefix of the descending-sorted top-k set whose renormalised
                     probability reaches p (the most likely token is always kept);
      min-p (m > 0): the tokens with prob >= m * max prob;
    and token = argmax over kept v of s_v + g_v with Gumbel noise g_v = -log(-log(u_v)), u from
    ``counter_hash`` at (seeds[b], offsets[b], v). Gumbel-max draws exactly from softmax(s) over
    the kept set, and u never depends on another row, so a row's token is batch invariant.

Shapes: temperature, top_p, min_p [B] fp32; top_k [B] int; seeds, offsets [B] int64 -> [B] int64.
The filters (sorts) are shared with the Triton path; only the draw differs (``draw_ref`` here).
"""

from __future__ import annotations

import torch

from kernels.reference.counter_hash import row_keys, uniforms


def apply_sampling_filters(
    logits: torch.Tensor,  # [B, V] fp32
    temperature: torch.Tensor,  # [B]
    top_k: torch.Tensor,  # [B] int, 0 = off
    top_p: torch.Tensor,  # [B], 1 = off
    min_p: torch.Tensor,  # [B], 0 = off
) -> torch.Tensor:  # [B, V] logits with the removed tokens set to -inf
    vocab = logits.shape[-1]
    sampled = temperature > 0
    k = top_k.long()
    use_k = sampled & (k > 0) & (k < vocab)
    use_p = sampled & (top_p < 1)
    use_m = sampled & (min_p > 0)
    rows = (use_k | use_p | use_m).nonzero().squeeze(1)  # [R]; one host sync per step
    if rows.numel() == 0:
        return logits
    s = logits[rows] / temperature[rows, None]  # [R, V] scaled logits
    keep = torch.ones_like(s, dtype=torch.bool)  # [R, V]
    if bool(use_k[rows].any() | use_p[rows].any()):
        s_sorted = s.sort(dim=-1, descending=True).values  # [R, V]
        kk = torch.where(use_k[rows], k[rows], vocab).clamp(1, vocab)  # [R]
        threshold = s_sorted.gather(1, (kk - 1)[:, None])  # [R, 1] k-th largest
        in_k = s_sorted >= threshold  # [R, V] the top-k set, ties included
        probs = torch.softmax(s_sorted.masked_fill(~in_k, float("-inf")), dim=-1)  # [R, V]
        mass_before = probs.cumsum(dim=-1) - probs  # [R, V] exclusive prefix sum
        n_p = ((mass_before < top_p[rows, None]) & in_k).sum(dim=-1).clamp(min=1)  # [R]
        threshold_p = s_sorted.gather(1, (n_p - 1)[:, None])  # [R, 1]
        threshold = torch.where(use_p[rows, None], torch.maximum(threshold, threshold_p), threshold)
        keep &= s >= threshold
    if bool(use_m[rows].any()):
        ratio = torch.exp(s - s.max(dim=-1, keepdim=True).values)  # [R, V] prob / max prob
        keep &= ~use_m[rows, None] | (ratio >= min_p[rows, None])
    out = logits.clone()
    out[rows] = logits[rows].masked_fill(~keep, float("-inf"))
    return out


def greedy_ref(logits: torch.Tensor) -> torch.Tensor:  # [B, V] fp32 -> [B] int64
    """The greedy draw from a model's logits: each row's argmax (first index on ties), or -1 for a
    row holding a NaN or an infinity (a broken forward the engine fails alone)."""
    return torch.where(torch.isfinite(logits).all(dim=-1), logits.argmax(dim=-1), -1)


def draw_ref(
    logits: torch.Tensor,  # [B, V] fp32, filtered
    temperature: torch.Tensor,  # [B]
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
) -> torch.Tensor:  # [B] int64
    tokens = logits.argmax(dim=-1)  # greedy rows keep this
    rows = (temperature > 0).nonzero().squeeze(1)  # [R]
    if rows.numel():
        u = uniforms(row_keys(seeds[rows], offsets[rows]), logits.shape[-1])  # [R, V]
        gumbel = -torch.log(-torch.log(u))
        scores = logits[rows] / temperature[rows, None] + gumbel  # [R, V]
        tokens[rows] = scores.argmax(dim=-1)
    return tokens


def sample_ref(
    logits: torch.Tensor,  # [B, V] fp32
    temperature: torch.Tensor,  # [B]
    top_k: torch.Tensor,  # [B] int
    top_p: torch.Tensor,  # [B]
    min_p: torch.Tensor,  # [B]
    seeds: torch.Tensor,  # [B] int64
    offsets: torch.Tensor,  # [B] int64
) -> torch.Tensor:  # [B] int64
    filtered = apply_sampling_filters(logits, temperature, top_k, top_p, min_p)
    return draw_ref(filtered, temperature, seeds, offsets)
