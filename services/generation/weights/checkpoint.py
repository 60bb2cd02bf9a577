"""A loaded checkpoint: the architecture plus an HF-named fp32 state dict, checked for completeness."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.generation.models.config import LlamaConfig
from services.generation.weights.q4 import Q4Weight
from services.generation.weights.vocabulary import Vocabulary


@dataclass
class Checkpoint:
    name: str  # for logs and ListModels
    source: str  # the file or directory it came from
    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]  # HF names, fp32, HF layout (q/k permutation undone)
    # GGUF only, when asked for (load_checkpoint(keep_q4=True)): the 4-bit linear weights as the
    # file stores them, same names and layout as state_dict (which still holds them dequantized).
    q4: dict[str, Q4Weight] = field(default_factory=dict)
    # What each token id spells (GGUF tokenizer metadata or tokenizer.json), for structured output;
    # None when the checkpoint carries no vocabulary the grammar library can read.
    vocabulary: Vocabulary | None = None
