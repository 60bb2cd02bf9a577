"""KernelOps.create: backend choice, the interpreter guard, one log line, no eager Triton import."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from kernels.dispatch import BACKEND_CPU, BACKEND_REFERENCE, BACKEND_TRITON, KernelOps


def test_importing_and_cpu_dispatch_do_not_import_triton():
    code = (
        "import sys, torch; from kernels.dispatch import KernelOps; import kernels.reference; "
        "ops = KernelOps.create(torch.device('cpu')); "
        "assert ops.backend == 'cpu'; assert 'triton' not in sys.modules, 'triton imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={"PATH": os.environ["PATH"], "TRITON_INTERPRET": "1"} | _pythonpath())  # PATH: the C++ compiler


def _pythonpath() -> dict[str, str]:
    return {"PYTHONPATH": ":".join(p for p in sys.path if p)}


@pytest.mark.parametrize("backend", [BACKEND_CPU, BACKEND_REFERENCE])
def test_cpu_backends_log_the_choice_once(caplog, backend):
    with caplog.at_level(logging.INFO, logger="kernels.dispatch"):
        ops = KernelOps.create(torch.device("cpu"), backend=backend if backend == BACKEND_REFERENCE else "auto")
    assert ops.backend == backend
    assert [r.getMessage() for r in caplog.records] == [f"kernel ops for cpu: {backend} backend"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(ops.silu_and_mul(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_an_unknown_or_misplaced_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="auto, cpu, reference, triton.*'mkl'"):
        KernelOps.create("cpu", backend="mkl")
    with pytest.raises(ValueError, match="CPU only"):
        KernelOps.create("meta", backend="cpu")


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
