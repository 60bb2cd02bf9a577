"""A loaded checkpoint: the architecture plus an HF-named fp32 state dict, checked for completeness."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.generation.models.config import LlamaConfig


@dataclass
class Checkpoint:
    name: str  # for logs and ListModels
    source: str  # the file or directory it came from
    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]  # HF names, fp32, HF layout (q/k permutation undone)
