"""Every launch the engine can make for the supported models: the model's forward on meta tensors.

The model (services/generation/models/llama.py) runs one step per shape in STEPS with a KernelOps
whose ops call the launchers' ``plan_*`` functions for a GPU target instead of launching, so the
matrix follows whatever the model and the launchers do (views into the fused qkv output, residual
or not, decode or prefill tiles, split-KV from the SM count) without restating their rules. Meta
tensors carry shapes, strides and dtypes but no memory: a 70B-shaped layer costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.launch import Launch, Target
from kernels.shapes import BLOCK_SIZES, DTYPES, SUPPORTED, ModelShape

META = torch.device("meta")


@dataclass(frozen=True)
class Step:
    """One engine step's shape: T scheduled tokens over B sequences, block tables for max_context."""

    name: str
    tokens: int
    seqs: int
    max_context: int


# Decode-only batches (T == B) from one sequence to a full batch, short and long contexts (1 to 32
# splits); prefill chunks alone and mixed with decode rows (the scheduler's chunked prefill).
STEPS = (
    Step("decode B=1 ctx=512", 1, 1, 512),
    Step("decode B=1 ctx=32k", 1, 1, 32768),
    Step("decode B=16 ctx=16k", 16, 16, 16384),
    Step("decode B=256 ctx=2k", 256, 256, 2048),
    Step("prefill 512", 512, 1, 512),
    Step("prefill chunk 2048 at 32k", 2048, 1, 32768),
    Step("4 decode + 256-token chunk", 260, 5, 4096),
)


@dataclass(frozen=True)
class Recorded:
    launch: Launch
    model: ModelShape
    dtype: torch.dtype
    step: Step


def engine_launches(target: Target, models=SUPPORTED, dtypes=DTYPES, block_sizes=BLOCK_SIZES) -> list[Recorded]:
    from services.generation.models.llama import Transformer

    out: list[Recorded] = []
    for model in models:
        config = _config(model)
        weights = {name: torch.empty(shape, device=META) for name, shape in config.expected_shapes().items()}
        for dtype in dtypes:
            ops = _CapturingOps(target)
            transformer = Transformer(config, ops.kernel_ops(), weights, META, dtype)
            for block_size in block_sizes:
                for step in STEPS:
                    ops.launches = []
                    run_step(transformer, ops, block_size, step)
                    out += [Recorded(launch, model, dtype, step) for launch in ops.launches]
    return out


def run_step(transformer, ops: _CapturingOps, block_size: int, step: Step) -> None:
    """One engine step through the model (2 layers: the first block's norm differs), then the draw."""
    from services.generation.models.kv_cache import KVCache
    from services.generation.models.llama import StepMetadata

    width = math.ceil(step.max_context / block_size)
    kv_cache = KVCache(transformer.config, step.seqs * width, block_size, META, transformer.embed.dtype)
    meta = StepMetadata(
        positions=torch.empty(step.tokens, dtype=torch.int64, device=META),
        slot_mapping=torch.empty(step.tokens, dtype=torch.int64, device=META),
        block_tables=torch.empty(step.seqs, width, dtype=torch.int32, device=META),
        cu_seqlens_q=torch.empty(step.seqs + 1, dtype=torch.int32, device=META),
        context_lens=torch.empty(step.seqs, dtype=torch.int32, device=META),
        logits_indices=torch.empty(step.seqs, dtype=torch.int64, device=META),
    )
    logits = transformer.forward(torch.empty(step.tokens, dtype=torch.int64, device=META), meta, kv_cache)
    rows = logits.shape[0]
    column = torch.empty(rows, device=META)
    ints = torch.empty(rows, dtype=torch.int64, device=META)
    ops.kernel_ops().sample(logits, column, ints, column, column, ints, ints)


def _config(model: ModelShape):
    from services.generation.models.config import LlamaConfig

    return LlamaConfig(
        vocab_size=model.vocab, hidden_size=model.hidden, intermediate_size=model.ffn, num_layers=2,
        num_heads=model.q_heads, num_kv_heads=model.kv_heads, head_dim=model.head_dim, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=32768, tie_word_embeddings=False,
    )


class _CapturingOps:
    """KernelOps' op table, each op planned for ``target`` and recorded instead of launched."""

    def __init__(self, target: Target):
        self.target = target
        self.launches: list[Launch] = []

    def kernel_ops(self):
        from kernels.dispatch import KernelOps

        return KernelOps(META, "aot", {
            "rms_norm": self.rms_norm, "apply_rotary": self.apply_rotary, "silu_and_mul": self.silu_and_mul,
            "store_kv": self.store_kv, "paged_attention": self.paged_attention, "sample": self.sample,
        })

    def _keep(self, planned):
        result, launches = planned
        self.launches += launches
        return result

    def rms_norm(self, x, weight, eps, residual=None):
        from kernels.rms_norm import plan_rms_norm

        return self._keep(plan_rms_norm(x, weight, eps, residual, self.target))

    def apply_rotary(self, q, k, positions, cos_sin):
        from kernels.rotary import plan_apply_rotary

        self.launches += plan_apply_rotary(q, k, positions, cos_sin, self.target)

    def silu_and_mul(self, x):
        from kernels.swiglu import plan_silu_and_mul

        return self._keep(plan_silu_and_mul(x, self.target))

    def store_kv(self, k, v, k_cache, v_cache, slots):
        from kernels.kv_cache import plan_store_kv

        self.launches += plan_store_kv(k, v, k_cache, v_cache, slots, self.target)

    def paged_attention(self, q, k_cache, v_cache, tables, cu_seqlens_q, context_lens, scale):
        from kernels.paged_attention import plan_paged_attention

        return self._keep(plan_paged_attention(q, k_cache, v_cache, tables, cu_seqlens_q, context_lens, scale, self.target))

    def sample(self, logits, temperature, top_k, top_p, min_p, seeds, offsets):
        # The filters (top-k/p, min-p) are torch ops; the Triton draw runs for every row.
        from kernels.sampling import plan_draw

        return self._keep(plan_draw(logits, temperature, seeds, offsets, self.target))
