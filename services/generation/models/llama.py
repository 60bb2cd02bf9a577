"""A Llama-family decoder over a paged KV cache, read top-down like gpt-fast's model.py.

    Transformer: embed -> N x Block -> final RMSNorm (only at the rows that need logits) -> lm_head
    Block:       x + Attention(RMSNorm(x)),  then  x + FeedForward(RMSNorm(x))  (fused add+norm)
    Attention:   one fused qkv matmul, RoPE, store K/V in the paged cache, paged attention, o_proj
    FeedForward: one fused gate|up matmul, silu(gate) * up, down_proj
    (each matmul is a models/linear.py projection: a dense weight, or 4-bit GGUF codes)

Every hot-path op except the matmuls goes through ``KernelOps`` (Triton on CUDA, torch references
on CPU). The checkpoint's separate q/k/v and gate/up matrices are concatenated once at load time:
on CPU the step is dominated by matmuls, and fewer, larger ones are faster. A step's tokens are a
flat [T] batch mixing decode rows and prefill chunks of different sequences; ``StepMetadata`` says
which rows belong to whom.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.dispatch import KernelOps
from services.generation.models.config import LlamaConfig, check_state_dict
from services.generation.models.linear import Dense, Int4
from services.generation.weights.q4 import Q4Weight

Projection = Dense | Int4


@dataclass
class StepMetadata:
    """Where a step's T tokens sit: built once per step by the ModelRunner, shared by all layers."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, block_id * block_size + offset
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32
    logits_indices: torch.Tensor  # [S] int64 rows whose logits are needed (last token of sampling seqs)


class KVCache:
    """One K and one V tensor per layer, allocated once: [num_blocks, block_size, Hk, D]."""

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, device, dtype):
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, NB, BS, Hk, D]
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def clear_blocks(self, block_ids: list[int]) -> None:
        """Zero blocks that may hold non-finite values, so no later reader can pick them up."""
        if block_ids:
            index = torch.tensor(block_ids, device=self.k.device)
            self.k[:, index] = 0
            self.v[:, index] = 0


class Attention:
    def __init__(self, config: LlamaConfig, ops: KernelOps, qkv_proj: Projection, o_proj: Projection):
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim**-0.5
        self.qkv_proj = qkv_proj  # H -> (Hq + 2 Hk) D
        self.o_proj = o_proj  # Hq D -> H

    def __call__(self, x, meta: StepMetadata, cos_sin, k_cache, v_cache) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hk) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)  # [T, Hq, D] (strided views into qkv)
        k = k.view(t, self.num_kv_heads, self.head_dim)  # [T, Hk, D]
        v = v.view(t, self.num_kv_heads, self.head_dim)  # [T, Hk, D]
        self.ops.apply_rotary(q, k, meta.positions, cos_sin)
        self.ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        o = self.ops.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens, self.scale
        )  # [T, Hq, D]
        return self.o_proj(o.reshape(t, self.q_size))  # [T, H]


class FeedForward:
    def __init__(self, ops: KernelOps, gate_up_proj: Projection, down_proj: Projection):
        self.ops = ops
        self.gate_up_proj = gate_up_proj  # H -> 2F
        self.down_proj = down_proj  # F -> H

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class Block:
    def __init__(self, config: LlamaConfig, ops: KernelOps, attention: Attention, ffn: FeedForward, norms):
        self.ops, self.eps = ops, config.rms_norm_eps
        self.attention, self.ffn = attention, ffn
        self.input_norm, self.post_attention_norm = norms  # [H] each

    def __call__(self, h, residual, meta, cos_sin, k_cache, v_cache):
        # residual is None only in the first block: there the stream is just the embeddings.
        if residual is None:
            residual, x = h, self.ops.rms_norm(h, self.input_norm, self.eps)
        else:
            x, residual = self.ops.rms_norm(h, self.input_norm, self.eps, residual)
        h = self.attention(x, meta, cos_sin, k_cache, v_cache)
        x, residual = self.ops.rms_norm(h, self.post_attention_norm, self.eps, residual)
        return self.ffn(x), residual


class Transformer:
    def __init__(self, config: LlamaConfig, ops: KernelOps, state_dict: dict, device, dtype,
                 q4: dict[str, Q4Weight] | None = None):
        """Fuse, cast and move the HF-named weights (checked first, so errors name the tensor).

        q4: 4-bit GGUF weights by HF name; a projection whose weights are all there runs as Int4.
        """
        check_state_dict(config, state_dict, "state dict")
        self.config, self.ops = config, ops

        def w(name: str) -> torch.Tensor:
            return state_dict[name].to(device=device, dtype=dtype).contiguous()

        def linear(*names: str) -> Projection:  # one projection from the rows of these weights
            if q4 is not None and all(n in q4 for n in names):
                return Int4(Q4Weight.cat([q4[n] for n in names]), dtype)
            return Dense(torch.cat([state_dict[n] for n in names], dim=0).to(device=device, dtype=dtype).contiguous())

        self.embed_tokens = w("model.embed_tokens.weight")  # [V, H]
        self.lm_head = self.embed_tokens if config.tie_word_embeddings else w("lm_head.weight")  # [V, H]
        self.norm = w("model.norm.weight")  # [H]
        self.blocks = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            attn = Attention(
                config,
                ops,
                linear(p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"),
                linear(p + "self_attn.o_proj.weight"),
            )
            ffn = FeedForward(ops, linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), linear(p + "mlp.down_proj.weight"))
            norms = (w(p + "input_layernorm.weight"), w(p + "post_attention_layernorm.weight"))
            self.blocks.append(Block(config, ops, attn, ffn, norms))
        self.cos_sin = ops.build_cos_sin_cache(
            config.head_dim, config.max_position_embeddings, config.rope_theta, device=device
        )  # [max_pos, D] fp32

    def forward(self, input_ids: torch.Tensor, meta: StepMetadata, kv_cache: KVCache) -> torch.Tensor:
        """input_ids [T] int64 -> logits [S, V] fp32 at meta.logits_indices."""
        return self.logits(self.final_hidden(input_ids, meta, kv_cache))

    def final_hidden(self, input_ids: torch.Tensor, meta: StepMetadata, kv_cache: KVCache) -> torch.Tensor:
        """input_ids [T] int64 -> hidden states [S, H] after the final norm at meta.logits_indices
        (what the lm_head reads; embedding requests pool them)."""
        h = F.embedding(input_ids, self.embed_tokens)  # [T, H]
        residual = None
        for i, block in enumerate(self.blocks):
            h, residual = block(h, residual, meta, self.cos_sin, kv_cache.k[i], kv_cache.v[i])
        rows = meta.logits_indices
        x, _ = self.ops.rms_norm(h[rows], self.norm, self.config.rms_norm_eps, residual[rows])  # [S, H]
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states [S, H] -> logits [S, V] fp32."""
        if x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, self.lm_head).float()  # [S, V]
        # CPU fp32: the [V, H] head (113 MB for SmolLM2) in 2048-row slices stays cache-friendly:
        # 14.1 vs 19.4 ms at 16 rows, and bit-identical (each logit is one dot product). In bf16 one
        # call is faster (6.5 vs 7.9 ms at 16 rows, 4.3 vs 5.0 at 1).
        return torch.cat([F.linear(x, w) for w in self.lm_head.split(2048)], dim=1).float()  # [S, V]
