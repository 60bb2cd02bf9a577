"""Fixtures of the surface tests; their helpers are in surface_harness.py (imported by name, so no
test depends on which directory's conftest Python imported last)."""

from __future__ import annotations

import pytest
from surface_harness import make_runner

from services.preprocess.model import load_model


@pytest.fixture(scope="session")
def model():
    return load_model("default")


@pytest.fixture
def runner(model):
    return make_runner(model)
