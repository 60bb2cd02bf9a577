"""Random-weight checkpoints of any Llama shape, for tests, smoke runs and transport benchmarks.

``save_hf_dir`` writes config.json + model.safetensors, so a random model goes through the same
loader as a real Hugging Face checkpoint.
"""

from __future__ import annotations

import json
import os

import torch

from services.generation.models.config import LlamaConfig
from services.generation.weights.checkpoint import Checkpoint

TINY = LlamaConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def random_checkpoint(config: LlamaConfig = TINY, seed: int = 0, std: float = 0.3) -> Checkpoint:
    """Weights ~ N(0, std) (norm weights ~ 1 + noise): peaked enough that greedy argmax is stable."""
    g = torch.Generator().manual_seed(seed)
    state_dict = {}
    for name, shape in config.expected_shapes().items():
        if name.endswith("norm.weight"):
            state_dict[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            state_dict[name] = std * torch.randn(shape, generator=g)
    return Checkpoint(name="random-llama", source="random", config=config, state_dict=state_dict)


def save_hf_dir(checkpoint: Checkpoint, directory: str) -> str:
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    raw = checkpoint.config.to_hf_dict() | {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(raw, f, indent=1)
    tensors = {k: v.contiguous() for k, v in checkpoint.state_dict.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    return directory
