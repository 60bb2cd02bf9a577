"""Shared fixtures: one torch thread, a tiny random Llama, and a helper that drives an engine."""

from __future__ import annotations

import pytest
import torch

from services.generation.weights.random_init import TINY, random_checkpoint


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_checkpoint():
    return random_checkpoint(TINY, seed=0)
