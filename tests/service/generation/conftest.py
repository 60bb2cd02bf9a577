"""A real generation server (subprocess, port 0) on a tiny random-weight HF checkpoint."""

from __future__ import annotations

import pytest
from generation_server_proc import start_server, stop_server

from services.generation.weights.random_init import random_checkpoint, save_hf_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return save_hf_dir(random_checkpoint(seed=0), str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    proc, port = start_server(tiny_model_dir, "--kv-blocks", "256", "--block-size", "4")
    yield port
    stop_server(proc)
