"""The real stack (generation with the default model, preprocess, Envoy), started once per test
session on free ports and torn down at the end. Reuse it from any e2e test:

    @pytest.mark.e2e
    def test_something(stack):          # services.stack.Stack
        httpx.post(stack.http_url + "/v1/generate", json=...)
        stack.generation_target, stack.preprocess_target, stack.admin_url, stack.log_dir ...

Set MSTAR_E2E_LOG_DIR to keep the three logs somewhere known (default: a temp dir, printed when
startup fails, together with the tail of every log).

Its generation service runs the step `make run` serves: the default GGUF through the fused decoder
stack (services/generation/fused_step.py), which compiles nothing, so the suite-wide
MSTAR_STEP=eager (tests/conftest.py: no Inductor graphs) becomes auto for it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.stack.stack import Stack, StackConfig


@pytest.fixture(scope="session")
def stack():
    log_dir = Path(os.environ["MSTAR_E2E_LOG_DIR"]) if os.environ.get("MSTAR_E2E_LOG_DIR") else None
    running = Stack(StackConfig.with_free_ports(log_dir=log_dir, ready_timeout_s=600.0))
    suite_setting = os.environ.get("MSTAR_STEP")
    os.environ["MSTAR_STEP"] = "auto"  # inherited by the services it starts
    try:
        running.start()
    finally:
        if suite_setting is None:
            os.environ.pop("MSTAR_STEP")
        else:
            os.environ["MSTAR_STEP"] = suite_setting
    try:
        yield running
    finally:
        running.stop()
