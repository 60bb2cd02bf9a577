"""The model step as one C++ call: every decoder layer in one parallel region (KernelOps.decoder_stack).

On CPU, when every projection holds a GGUF's block codes (the default for a GGUF) and the
activations are fp32, the 30 layers of a step need no graph at all: ``decoder_stack`` runs
RMSNorm, the quantized matmuls, RoPE + KV store + paged attention and SiLU x up for every layer
with its threads meeting at barriers, so nothing runs between two projections but the next one.
The embedding lookup and the LM head stay the model's own (models/llama.py), so the logits are
computed as the per-op path computes them. Any step (decode, prefill, mixed, any batch) runs the
same code, so a sequence's tokens never depend on its batch-mates.

Measured on the 2-core AVX2 box (default model, interleaved pairs in one process): a step 1.12x
as fast as the Inductor graph's at one row (7.9 against 8.9 ms) and 1.06x at 16 rows; nothing to
compile (a warm start's warm-up 0 s against 10 s; a cold one skips Inductor's ~100 s); 65 MB
less RSS.

A Step (step.py): covers every batch, logits or final hidden states. The stack is a KernelOps op
("cpu" backend only, kernels/cpu decoder_stack), so this step calls the model's kernels like the others.
"""

from __future__ import annotations

import logging
import time

import torch

from services.generation.compiled_step import padding_step
from services.generation.models.kv_cache import KVCache
from services.generation.models.linear import Quantized
from services.generation.models.llama import Transformer
from services.generation.step import StepBatch

log = logging.getLogger(__name__)


def fusable(model: Transformer, kv_cache: KVCache) -> bool:
    """The stack can run as decoder_stack: CPU, kernels that have it (cpu), fp32 activations and
    norms, an fp32 or bf16 cache, every layer's four projections block codes, and Llama's layers
    (decoder_stack has no q/k/v bias, QK-norm, sliding window, sandwich norms, GeGLU or scaled
    embeddings: Qwen, Mistral, Gemma run the per-op path)."""
    projections = [p for b in model.blocks
                   for p in (b.attention.qkv_proj, b.attention.o_proj, b.ffn.gate_up_proj, b.ffn.down_proj)]
    parts = model.config.parts
    if (parts.qkv_bias or parts.qk_norm or parts.sandwich_norms or parts.activation != "silu" or parts.embed_scaled
            or any(b.attention.window for b in model.blocks)):
        return False
    return (model.ops.supports("decoder_stack") and kv_cache.k[0].device.type == "cpu"
            and kv_cache.dtype in (torch.float32, torch.bfloat16) and model.embed.dtype == torch.float32
            and model.norm.dtype == torch.float32 and all(isinstance(p, Quantized) for p in projections))


class FusedStep:
    """Every step through decoder_stack; built once per runner (the weights' lists are kept)."""

    name = "fused"

    def __init__(self, model: Transformer, kv_cache: KVCache):
        if not fusable(model, kv_cache):
            raise ValueError("the fused step needs fp32 activations and block-coded projections on the cpu kernels")
        self.model, self.kv_cache = model, kv_cache
        config = model.config
        self.norms = [n for b in model.blocks for n in (b.input_norm, b.post_attention_norm)] + [model.norm]
        self.weights = [p.packed for b in model.blocks
                        for p in (b.attention.qkv_proj, b.attention.o_proj, b.ffn.gate_up_proj, b.ffn.down_proj)]
        self.heads = (config.num_heads, config.num_kv_heads, config.head_dim**-0.5, config.rms_norm_eps)
        self.is_warm = False

    def covers(self, batch: StepBatch) -> bool:
        # Hidden states (embedding requests) stay the per-op path's: decoder_stack's differ from it
        # within 1e-3 (RMSNorm and SiLU sum in another order), and embeddings keep their bits.
        return batch.input_ids.shape[0] > 0 and not batch.hidden

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One step of padding rows (writes and reads no cache): faults the buffers in."""
        t0 = time.monotonic()
        self(StepBatch(*padding_step(2, 2, self.kv_cache.k[0].device)))
        self.is_warm = True
        log.info("fused decoder stack ready", extra={"seconds": round(time.monotonic() - t0, 2)})

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        """logits [S, V] fp32, or with batch.hidden [S, H] fp32 after the final norm (as
        Transformer.final_hidden), at meta.logits_indices."""
        meta = batch.meta
        hidden = self.model.ops.decoder_stack(
            self.model.input_embeddings(batch.input_ids, batch.embeds), self.norms, self.weights, self.kv_cache.k, self.kv_cache.v,
            meta.positions, meta.slot_mapping, meta.block_tables.contiguous(), meta.cu_seqlens_q, meta.context_lens,
            meta.logits_indices, self.model.cos_sin, *self.heads)
        return hidden if batch.hidden else self.model.logits(hidden)
