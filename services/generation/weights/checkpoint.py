"""A loaded checkpoint: the architecture plus its HF-named weights, checked for completeness."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from services.common.pixel_normalization import PixelNormalization
from services.generation.models.block_weight import BlockWeight
from services.generation.models.config import DecoderConfig
from services.generation.models.vision import VisionConfig
from services.generation.weights.vocabulary import Vocabulary


@dataclass
class VisionWeights:
    """An Idefics3 checkpoint's image side: the encoder's config and HF-named weights, and the
    token id whose prompt positions take the image embeddings."""

    config: VisionConfig
    tensors: dict[str, torch.Tensor]  # model.vision_model.*, model.connector.*
    image_token_id: int
    # The image processor's rescale + normalize (preprocessor_config.json): uint8 tiles -> pixels.
    normalization: PixelNormalization = field(default_factory=PixelNormalization)


@dataclass
class Checkpoint:
    name: str  # for logs and ListModels
    source: str  # the file or directory it came from
    config: DecoderConfig
    tensors: dict[str, torch.Tensor]  # HF names, fp32, HF layout (q/k permutation undone)
    # GGUF only: the block-quantized weights as the file's codes (weights/blocks.py), same names and
    # layout; a name is in exactly one of tensors and blocks.
    blocks: dict[str, BlockWeight] = field(default_factory=dict)
    # What each token id spells (GGUF tokenizer metadata or tokenizer.json), for structured output;
    # None when the checkpoint carries no vocabulary the grammar library can read.
    vocabulary: Vocabulary | None = None
    # A vision-language checkpoint (Idefics3): its image encoder; None for a text-only model.
    vision: VisionWeights | None = None

    def dense(self, name: str) -> torch.Tensor:
        """One weight as a dense fp32 tensor (block weights dequantized exactly)."""
        return self.tensors[name] if name in self.tensors else self.blocks[name].dequantize()

    @cached_property
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight dense, HF names (for transformers' load_state_dict in tests and benchmarks)."""
        return {**self.tensors, **{name: b.dequantize() for name, b in self.blocks.items()}}
