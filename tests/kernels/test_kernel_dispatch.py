"""KernelOps.create: backend choice, the interpreter guard, one log line, no eager Triton import."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from kernels.dispatch import BACKEND_TORCH, BACKEND_TRITON, KernelOps


def test_importing_and_cpu_dispatch_do_not_import_triton():
    code = (
        "import sys, torch; from kernels.dispatch import KernelOps; import kernels.reference; "
        "ops = KernelOps.create(torch.device('cpu')); "
        "assert ops.backend == 'torch'; assert 'triton' not in sys.modules, 'triton imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "", "TRITON_INTERPRET": "1"} | _pythonpath())


def _pythonpath() -> dict[str, str]:
    return {"PYTHONPATH": ":".join(p for p in sys.path if p)}


def test_cpu_uses_the_references_and_logs_the_choice_once(caplog):
    with caplog.at_level(logging.INFO, logger="kernels.dispatch"):
        ops = KernelOps.create(torch.device("cpu"))
    assert ops.backend == BACKEND_TORCH
    assert [r.getMessage() for r in caplog.records] == ["kernel ops for cpu: torch backend"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(ops.silu_and_mul(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_force_triton_without_the_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        KernelOps.create(torch.device("cpu"), force_triton=True)


@pytest.mark.interpreter
def test_force_triton_on_cpu_uses_the_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ops = KernelOps.create("cpu", force_triton=True)
    assert ops.backend == BACKEND_TRITON
    cache = ops.build_cos_sin_cache(8, 16, 10000.0)
    assert cache.shape == (16, 8)
