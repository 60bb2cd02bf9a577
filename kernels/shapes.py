"""The model shapes the kernels are compiled for (kernels/aot), and benchmarked at (bench/).

Chosen to cover what the launchers branch on: head dim 64, 128 and 256 (BLOCK_D), GQA ratios 1, 3,
4 and 8 (GROUP_PAD 1, 4, 8), hidden sizes from 576 to 8192 (BLOCK_H, warps), vocabularies of 32k,
49k, 128k and 262k, and the launches only other families make (Gemma 3: windowed paged attention,
GeGLU, QK-norm rows of 256). Numbers from each model's config.json on the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    ffn: int  # intermediate size
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    family: str = "llama"  # services/generation/models/families.py: which parts the model's calls use
    window: int = 0  # its sliding-window layers' window (0: none)

    @property
    def group(self) -> int:  # query heads per KV head
        return self.q_heads // self.kv_heads


DEFAULT = ModelShape("SmolLM2-135M", 576, 1536, 9, 3, 64, 49152)  # the embedded default model
LLAMA_3_8B = ModelShape("Llama-3-8B", 4096, 14336, 32, 8, 128, 128256)
SUPPORTED = (
    DEFAULT,  # G 3, D 64
    ModelShape("SmolLM2-1.7B", 2048, 8192, 32, 32, 64, 49152),  # G 1
    ModelShape("Llama-3.2-1B", 2048, 8192, 32, 8, 64, 128256),  # G 4
    ModelShape("TinyLlama-1.1B", 2048, 5632, 32, 4, 64, 32000),  # G 8
    ModelShape("Llama-3.2-3B", 3072, 8192, 24, 8, 128, 128256),  # G 3, D 128
    LLAMA_3_8B,  # G 4
    ModelShape("Llama-2-7B", 4096, 11008, 32, 32, 128, 32000),  # G 1
    ModelShape("Llama-3-70B", 8192, 28672, 64, 8, 128, 128256),  # G 8, H 8192
    ModelShape("Gemma-3-270M", 640, 2048, 4, 1, 256, 262144, "gemma3", 512),  # G 4, D 256, windows
)
# fp32 and bf16 are the engine's --dtype choices; fp16 is compiled too (the kernels accept it and
# half of the hub's Llama checkpoints are stored in it), so adding it to the engine is safe.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK_SIZES = (16, 32)  # KV-cache page sizes (--block-size)
