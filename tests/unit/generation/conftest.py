"""Shared fixtures: one torch thread, a tiny random Llama, and a helper that drives an engine."""

from __future__ import annotations

import pytest
import torch

from services.generation.weights.random_init import TINY, random_checkpoint


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def _tiny_checkpoint_and_fingerprint():
    checkpoint = random_checkpoint(TINY, seed=0)
    return checkpoint, _fingerprint(checkpoint)


@pytest.fixture
def tiny_checkpoint(_tiny_checkpoint_and_fingerprint):
    """The session's tiny Llama. Shared by every test, so a test must never write into it (copy the
    tensor it wants to change); checked after each test, so a mutation fails the test that made it."""
    checkpoint, before = _tiny_checkpoint_and_fingerprint
    yield checkpoint
    assert _fingerprint(checkpoint) == before, "a test mutated the shared tiny checkpoint"


def _fingerprint(checkpoint) -> dict[str, bytes]:
    return {name: t.detach().contiguous().numpy().tobytes() for name, t in checkpoint.state_dict.items()}
