"""Shared fixtures: the default model's tokenizer (ours) and transformers' (the oracle)."""

from __future__ import annotations

import pytest

from services.preprocess.model import ModelSpec, default_model_path, load_model


@pytest.fixture(scope="session")
def model_spec() -> ModelSpec:
    return load_model("default")


@pytest.fixture(scope="session")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
