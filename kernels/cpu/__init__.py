"""The CPU serving path's ops: C++ compiled for this machine (``csrc/``), loaded on first use.

    quant_matmul(x [M, K], w: PackedWeight) -> [M, N] fp32
        activations x GGUF block-quantized weights (packing.py): x is quantized per 32-wide block
        to int8 and multiplied with the weight's 4- or 8-bit codes in integer arithmetic (VNNI).
    attention(qkv [T, (Hq + 2 Hk) D], positions, cos_sin, k_cache, v_cache, slot_mapping,
              block_tables, cu_seqlens_q, context_lens, num_heads, num_kv_heads, scale, window=0) -> [T, Hq D]
        one layer's RoPE + KV-cache write + paged causal attention in one call (window > 0: each
        row sees its last `window` keys only).
    dequantize_rows(w: PackedWeight, ids [T]) -> [T, K] fp32
        rows of a packed weight, dequantized (a quantized embedding's lookups); oracle:
        packing.unpack_rows (the same two roundings, bit for bit).
    decoder_stack(h [T, H] fp32, ...) -> [S, H] fp32
        every decoder layer of a model whose projections are all block codes, and the final norm at
        the logits rows, in one call and one parallel region (services/generation/fused_step.py).
    argmax_rows(logits [B, V] fp32) -> [B] int64
        the greedy draw (first index of the max, like torch.argmax, vectorised).
    greedy_rows(logits [B, V] fp32) -> [B] int64
        argmax_rows straight from the model: -1 for a row holding a NaN or an infinity.
    gumbel_argmax(logits [R, V] fp32 filtered, temperature [R], seeds [R], offsets [R]) -> [R] int64
        the sampled draw (the reference's draw_ref), hashing only the tokens that can win.
    instruction_sets() -> ["avx2", "fma", ...]
        what the loaded build was compiled for, among the features the kernels branch on: which
        paths run (library.ISAS; $MSTAR_KERNEL_ISA forces a build).

Their plain-torch oracles are kernels.reference.quant_matmul_ref, the reference rotary / store_kv /
paged_attention ops and greedy_ref; tests/kernels/test_cpu_ops.py holds them together.
``ensure_loaded()`` builds/loads the library (library.py) and registers the ops' fake tensor
implementations so torch.compile can trace through them as opaque calls.
"""

from __future__ import annotations

import torch

from kernels.cpu import library
from kernels.cpu.packing import PackedWeight, pack, unpack_rows

__all__ = ["PackedWeight", "argmax_rows", "attention", "decoder_stack", "dequantize_rows", "ensure_loaded", "greedy_rows",
           "gumbel_argmax",
           "instruction_sets", "load_error", "pack",
           "quant_matmul", "unpack_rows"]

_fakes_registered = False


def ensure_loaded() -> None:
    """Load torch.ops.mstar_cpu (building it if needed); raises library.KernelBuildError."""
    global _fakes_registered
    library.load()
    if _fakes_registered:
        return

    @torch.library.register_fake("mstar_cpu::quant_matmul")
    def _quant_matmul_fake(x, codes, scale, offset, bits, n):
        return x.new_empty((x.shape[0], n), dtype=torch.float32)

    @torch.library.register_fake("mstar_cpu::attention")
    def _attention_fake(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, cu_seqlens_q,
                        context_lens, num_heads, num_kv_heads, scale, window=0):
        return qkv.new_empty((qkv.shape[0], num_heads * k_cache.shape[-1]))

    @torch.library.register_fake("mstar_cpu::dequantize_rows")
    def _dequantize_rows_fake(codes, scale, offset, bits, n, k, ids):
        return ids.new_empty((ids.shape[0], k), dtype=torch.float32)

    @torch.library.register_fake("mstar_cpu::argmax_rows")
    def _argmax_rows_fake(logits):
        return logits.new_empty((logits.shape[0],), dtype=torch.int64)

    _fakes_registered = True


def load_error() -> library.KernelBuildError | None:
    """None when the ops are usable here, else why not."""
    error = library.load_error()
    if error is None:
        ensure_loaded()
    return error


def quant_matmul(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:  # [M, K] -> [M, N] fp32
    return torch.ops.mstar_cpu.quant_matmul(x, w.codes, w.scale, w.offset, w.bits, w.rows)


def attention(
    qkv: torch.Tensor,  # [T, (Hq + 2 Hk) D], contiguous
    positions: torch.Tensor,  # [T] int64
    cos_sin: torch.Tensor,  # [max_pos, D] fp32
    k_cache: torch.Tensor,  # [NB, BS, Hk, D], written at slot_mapping
    v_cache: torch.Tensor,  # [NB, BS, Hk, D]
    slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
    block_tables: torch.Tensor,  # [B, W] int32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    context_lens: torch.Tensor,  # [B] int32
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    window: int = 0,  # > 0: a row sees only its last `window` keys (sliding-window layers)
) -> torch.Tensor:  # [T, Hq D] in qkv's dtype
    return torch.ops.mstar_cpu.attention(qkv, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables,
                                         cu_seqlens_q, context_lens, num_heads, num_kv_heads, scale, window)


def dequantize_rows(w: PackedWeight, ids: torch.Tensor) -> torch.Tensor:  # [T] int64 -> [T, K] fp32
    return torch.ops.mstar_cpu.dequantize_rows(w.codes, w.scale, w.offset, w.bits, w.rows, w.cols, ids)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:  # [B, V] fp32 -> [B] int64
    return torch.ops.mstar_cpu.argmax_rows(logits)


def greedy_rows(logits: torch.Tensor) -> torch.Tensor:  # [B, V] fp32 -> [B] int64, -1 = not finite
    return torch.ops.mstar_cpu.greedy_rows(logits)


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                  offsets: torch.Tensor) -> torch.Tensor:
    """The sampled draw of filtered logits [R, V] fp32: argmax of logits / t + Gumbel noise at
    (seeds, offsets) [R] int64, the reference's draw_ref; t = 0 rows take the argmax."""
    return torch.ops.mstar_cpu.gumbel_argmax(logits, temperature.float(), seeds.long(), offsets.long())


def instruction_sets() -> list[str]:
    return torch.ops.mstar_cpu.instruction_sets().split()


def decoder_stack(h: torch.Tensor, norms: list[torch.Tensor], weights: list[PackedWeight], k_caches: list[torch.Tensor],
                  v_caches: list[torch.Tensor], positions: torch.Tensor, slot_mapping: torch.Tensor,
                  block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                  logits_indices: torch.Tensor, cos_sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                  scale: float, eps: float) -> torch.Tensor:
    """h [T, H] fp32 embeddings -> [S, H] fp32 final hidden states at logits_indices. norms: each
    layer's input and post-attention norm weights, then the final norm; weights: each layer's qkv,
    o, gate_up and down projections; the caches are written at slot_mapping."""
    return torch.ops.mstar_cpu.decoder_stack(
        h, norms, [w.codes for w in weights], [w.scale for w in weights], [w.offset for w in weights],
        [w.bits for w in weights], [w.rows for w in weights], k_caches, v_caches, positions, slot_mapping,
        block_tables, cu_seqlens_q, context_lens, logits_indices, cos_sin, num_heads, num_kv_heads, scale, eps)
