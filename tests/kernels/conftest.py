"""Kernel test setup: Triton runs natively on CUDA and through its interpreter on CPU.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at conftest import,
and only when there is no GPU (the GPU run must compile real kernels).
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from kernels.dispatch import KernelOps  # noqa: E402  (after the environment is set)

# Targets for the kernel-vs-reference tests: the interpreter on CPU, real kernels on the GPU.
INTERPRETER = pytest.param("cpu", marks=pytest.mark.interpreter, id="interp")
GPU = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")], id="gpu"
)
TARGETS = [INTERPRETER, GPU]


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    # Other engineers run tests on the same 2 cores: one thread each avoids oversubscription.
    # MSTAR_TEST_THREADS: test_cpu_ops_threads.py reruns the C++ op tests with several threads.
    torch.set_num_threads(int(os.environ.get("MSTAR_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def seed() -> int:
    """Every test starts from the same RNG state (reproducible shapes and values, no reruns)."""
    value = 1234
    torch.manual_seed(value)
    return value


@pytest.fixture(params=TARGETS)
def triton_ops(request) -> KernelOps:
    """KernelOps with the Triton backend; parametrises the test over interpreter and GPU."""
    device = torch.device(request.param)
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter target needs TRITON_INTERPRET=1 (set only when there is no GPU)")
    return KernelOps.create(device, force_triton=True)


@pytest.fixture
def ref_ops() -> KernelOps:
    return KernelOps.create(torch.device("cpu"))
