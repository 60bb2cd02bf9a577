"""kernels/aot/kernel_calls.json is what the model calls now: the AOT gate compiles from it."""

from kernels.aot.matrix import CALLS_PATH
from services.generation.kernel_calls import record, render


def test_the_recorded_kernel_calls_are_current():
    assert CALLS_PATH.read_text() == render(record()), (
        "the model's KernelOps calls changed: run `make kernel-calls` and commit kernels/aot/kernel_calls.json")
