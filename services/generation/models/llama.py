"""The decoder of every family in models/families.py over a paged KV cache, read top-down like
gpt-fast's model.py (Llama's shape; a family switches parts on, marked below).

    Transformer: embed [x sqrt(H): Gemma] -> N x Block -> final RMSNorm (only at the rows that need
                 logits) -> lm_head
    Block:       x + Attention(RMSNorm(x)),  then  x + FeedForward(RMSNorm(x))  (fused add+norm)
                 [Gemma: x + RMSNorm(Attention(RMSNorm(x))), likewise around FeedForward]
    Attention:   one fused qkv matmul (+ bias: Qwen2), [RMSNorm per q and k head: Qwen3, Gemma], then
                 KernelOps.attention (RoPE, store K/V in the paged cache, paged attention over every
                 key or the layer's sliding window: one fused C++ op on CPU), o_proj. Gemma's
                 windowed layers read their own RoPE table (another base).
    FeedForward: one fused gate|up matmul, silu(gate) * up [Gemma: gelu_tanh(gate) * up], down_proj
    (each matmul is a models/linear.py projection: a dense weight, or the GGUF's block codes)

Every hot-path op except the matmuls goes through ``KernelOps`` (C++ or reference ops on CPU,
Triton on CUDA). The checkpoint's separate q/k/v and gate/up matrices are concatenated once at
load time: fewer, larger matmuls are faster. A step's tokens are a flat [T] batch mixing decode
rows and prefill chunks of different sequences; ``StepMetadata`` says which rows belong to whom
and is passed explicitly to every layer (no hidden per-step state). The modules hold no per-step
state either, so one instance serves eager steps and compiled decode graphs alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu
from kernels.dispatch import KernelOps
from services.generation.models.block_weight import BlockWeight
from services.generation.models.config import DecoderConfig, check_state_dict
from services.generation.models.kv_cache import KVCache
from services.generation.models.linear import Dense, Embedding, Projection, Quantized


@dataclass
class StepMetadata:
    """Where a step's T tokens sit: built once per step by the ModelRunner, passed to every layer."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset; -1 = padding, not stored
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32
    logits_indices: torch.Tensor  # [S] int64 rows whose logits are needed (last token of sampling seqs)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, ops: KernelOps, qkv_proj: Projection, o_proj: Projection,
                 qk_norms: tuple[torch.Tensor, torch.Tensor] | None = None, window: int = 0):
        super().__init__()
        self.ops, self.eps = ops, config.rms_norm_eps
        self.window = window  # 0 = every key; > 0: a sliding-window layer (Mistral, Qwen)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.scale = config.attention_scale
        self.qkv_proj = qkv_proj  # H -> (Hq + 2 Hk) D
        self.o_proj = o_proj  # Hq D -> H
        self.qk_norm = qk_norms is not None
        if qk_norms is not None:
            self.register_buffer("q_norm", qk_norms[0], persistent=False)  # [D]
            self.register_buffer("k_norm", qk_norms[1], persistent=False)  # [D]

    def forward(self, x, meta: StepMetadata, cos_sin, k_cache, v_cache) -> torch.Tensor:  # [T, H] -> [T, H]
        qkv = self.qkv_proj(x)
        if self.qk_norm:
            qkv = self._norm_heads(qkv)
        o = self.ops.attention(
            qkv, meta.positions, meta.slot_mapping, meta.block_tables, meta.cu_seqlens_q,
            meta.context_lens, cos_sin, k_cache, v_cache, self.num_heads, self.num_kv_heads, self.scale, self.window,
        )  # [T, Hq D]
        return self.o_proj(o)

    def _norm_heads(self, qkv: torch.Tensor) -> torch.Tensor:
        """Qwen3's and Gemma's QK-norm: each q and k head [D] RMS-normalized (its own weight) before RoPE."""
        t, d = qkv.shape[0], self.head_dim
        q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q = self.ops.rms_norm(q.reshape(t * self.num_heads, d), self.q_norm, self.eps)
        k = self.ops.rms_norm(k.reshape(t * self.num_kv_heads, d), self.k_norm, self.eps)
        return torch.cat([q.view(t, -1), k.view(t, -1), v], dim=-1)


class FeedForward(nn.Module):
    def __init__(self, ops: KernelOps, gate_up_proj: Projection, down_proj: Projection, activation: str = "silu"):
        super().__init__()
        self.ops = ops
        self.gate_up_proj = gate_up_proj  # H -> 2F
        self.down_proj = down_proj  # F -> H
        self.gated = ops.silu_and_mul if activation == "silu" else ops.gelu_tanh_and_mul  # families.py

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.down_proj(self.gated(self.gate_up_proj(x)))


class Block(nn.Module):
    def __init__(self, config: DecoderConfig, ops: KernelOps, attention: Attention, ffn: FeedForward, norms,
                 output_norms: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.ops, self.eps = ops, config.rms_norm_eps
        self.attention, self.ffn = attention, ffn
        self.register_buffer("input_norm", norms[0], persistent=False)  # [H]
        self.register_buffer("post_attention_norm", norms[1], persistent=False)  # [H], before the FeedForward
        self.sandwich = output_norms is not None  # Gemma: the sublayers' outputs are normed too
        if output_norms is not None:
            self.register_buffer("attention_output_norm", output_norms[0], persistent=False)  # [H]
            self.register_buffer("ffn_output_norm", output_norms[1], persistent=False)  # [H]

    def forward(self, h, residual, meta, cos_sin, k_cache, v_cache):
        # residual is None only in the first block: there the stream is just the embeddings.
        if residual is None:
            residual, x = h, self.ops.rms_norm(h, self.input_norm, self.eps)
        else:
            x, residual = self.ops.rms_norm(h, self.input_norm, self.eps, residual)
        h = self.attention(x, meta, cos_sin, k_cache, v_cache)
        if self.sandwich:
            h = self.ops.rms_norm(h, self.attention_output_norm, self.eps)
        x, residual = self.ops.rms_norm(h, self.post_attention_norm, self.eps, residual)
        h = self.ffn(x)
        if self.sandwich:
            h = self.ops.rms_norm(h, self.ffn_output_norm, self.eps)
        return h, residual


class Transformer(nn.Module):
    def __init__(self, config: DecoderConfig, ops: KernelOps, tensors: dict[str, torch.Tensor], device, dtype,
                 blocks: dict[str, BlockWeight] | None = None, quantized: bool = False):
        """Fuse, cast and move the HF-named weights (checked first, so errors name the tensor).

        tensors: dense weights by HF name; blocks: a GGUF's block-quantized weights by HF name
        (weights/blocks.py). quantized: serve the blocks as codes (Quantized, CPU C++ ops: a
        fused projection only when all its parts are blocks); otherwise they are dequantized.
        """
        super().__init__()
        blocks = blocks or {}
        check_state_dict(config, {**tensors, **blocks}, "state dict")
        self.config, self.ops = config, ops

        def dense(name: str) -> torch.Tensor:
            return tensors[name] if name in tensors else blocks[name].dequantize()

        def w(name: str) -> torch.Tensor:
            return dense(name).to(device=device, dtype=dtype).contiguous()

        def linear(*names: str, bias: bool = False) -> Projection:  # one projection from these weights' rows
            b = None
            if bias:  # the weights' biases, concatenated as their rows are
                b = torch.cat([dense(n.removesuffix("weight") + "bias") for n in names]).to(device=device)
            if quantized and all(n in blocks for n in names):
                return Quantized(BlockWeight.cat([blocks[n] for n in names]), None if b is None else b.float())
            weight = torch.cat([dense(n) for n in names], dim=0).to(device=device, dtype=dtype).contiguous()
            return Dense(weight, None if b is None else b.to(dtype))

        parts = config.parts  # the family's switches (families.py)
        table = linear("model.embed_tokens.weight")  # [V, H]
        self.embed = Embedding(table, dtype)
        # Gemma: sqrt(H) rounded to the weights' dtype first, as transformers does
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype).item() if parts.embed_scaled else None
        self.lm_head = table if config.tie_word_embeddings else linear("lm_head.weight")  # [V, H]
        self.register_buffer("norm", w("model.norm.weight"), persistent=False)  # [H]
        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            attn = Attention(
                config,
                ops,
                linear(p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                       bias=config.qkv_bias),
                linear(p + "self_attn.o_proj.weight"),
                (w(p + "self_attn.q_norm.weight"), w(p + "self_attn.k_norm.weight")) if config.qk_norm else None,
                config.window(i),
            )
            ffn = FeedForward(ops, linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                              linear(p + "mlp.down_proj.weight"), parts.activation)
            if parts.sandwich_norms:  # HF's Gemma names: post_attention_layernorm norms the attention output
                norms = (w(p + "input_layernorm.weight"), w(p + "pre_feedforward_layernorm.weight"))
                outputs = (w(p + "post_attention_layernorm.weight"), w(p + "post_feedforward_layernorm.weight"))
                layers.append(Block(config, ops, attn, ffn, norms, outputs))
            else:
                norms = (w(p + "input_layernorm.weight"), w(p + "post_attention_layernorm.weight"))
                layers.append(Block(config, ops, attn, ffn, norms))
        self.blocks = nn.ModuleList(layers)
        cos_sin = ops.build_cos_sin_cache(config.head_dim, config.max_position_embeddings, config.rope_theta, device=device,
                                          llama3=dict(config.rope_llama3 or {}) or None,
                                          freq_factors=config.rope_freq_factors)
        self.register_buffer("cos_sin", cos_sin, persistent=False)  # [max_pos, D] fp32
        local = None  # Gemma's windowed layers: their own RoPE base, unscaled
        if config.rope_local_theta:
            local = ops.build_cos_sin_cache(config.head_dim, config.max_position_embeddings, config.rope_local_theta,
                                            device=device)
        self.register_buffer("local_cos_sin", local, persistent=False)  # [max_pos, D] fp32 or None
        self.layer_cos_sin = [self.local_cos_sin if self.local_cos_sin is not None and config.window(i) else cos_sin
                              for i in range(config.num_layers)]

    def forward(self, input_ids: torch.Tensor, meta: StepMetadata, kv_cache: KVCache, embeds=None) -> torch.Tensor:
        """input_ids [T] int64 -> logits [S, V] fp32 at meta.logits_indices."""
        return self.logits(self.final_hidden(input_ids, meta, kv_cache, embeds))

    def input_embeddings(self, input_ids: torch.Tensor, embeds=None) -> torch.Tensor:
        """[T] -> [T, H]: the token embeddings (scaled where the family scales them), with
        embeds = (rows, values) in place of those rows' (image tokens: step.StepBatch.embeds)."""
        h = self.embed(input_ids)  # [T, H]
        if self.embed_scale is not None:
            h = h * self.embed_scale
        if embeds is not None:
            rows, values = embeds
            h = h.index_copy(0, rows, values.to(h.dtype))
        return h

    def final_hidden(self, input_ids: torch.Tensor, meta: StepMetadata, kv_cache: KVCache, embeds=None) -> torch.Tensor:
        """input_ids [T] int64 -> hidden states [S, H] after the final norm at meta.logits_indices
        (what the lm_head reads; embedding requests pool them)."""
        h = self.input_embeddings(input_ids, embeds)
        residual = None
        for i, block in enumerate(self.blocks):
            h, residual = block(h, residual, meta, self.layer_cos_sin[i], kv_cache.k[i], kv_cache.v[i])
        rows = meta.logits_indices
        x, _ = self.ops.rms_norm(h[rows], self.norm, self.config.rms_norm_eps, residual[rows])  # [S, H]
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states [S, H] -> logits [S, V] fp32."""
        head = self.lm_head
        if isinstance(head, Quantized):
            return cpu.quant_matmul(x, head.packed)  # fp32 as is, no round trip through the activation dtype
        if x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, head.weight).float()
        # CPU fp32: the [V, H] head (113 MB for SmolLM2) in 2048-row slices stays cache-friendly:
        # 14.1 vs 19.4 ms at 16 rows, and bit-identical (each logit is one dot product).
        return torch.cat([F.linear(x, w) for w in head.weight.split(2048)], dim=1)
