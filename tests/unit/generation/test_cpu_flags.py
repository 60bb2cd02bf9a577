"""The one numerics default that reads the CPU, taken both ways on every machine.

numerics.choose serves HF weights in bf16 (activations and KV cache) where the CPU has native bf16
(avx512_bf16 or AMX), else fp32, from the flags numerics.detect_cpu_flags() reads. tests/conftest.py
pins those flags ($MSTAR_CPU_FLAGS) to a CPU's without bf16, so what the suite compares is the same
everywhere. Here the tests whose runners take the defaults on HF weights rerun in a child pytest in
the other branch: as on a Sapphire Rapids (bf16, emulated by torch where the CPU lacks it: slower,
same code path), or as on a plain CPU when the run itself was started with bf16 flags. What they
compare with (eager steps, the oracle, HF) must hold in either. test_numerics.py tests the decision.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.generation import numerics
from services.generation.model_runner import ModelRunner, RunnerConfig

BF16_CPU = "fpu sse2 avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile"
PLAIN_CPU = "fpu sse2 avx2 fma f16c"
HERE = Path(__file__).resolve().parent
# Every file here whose runners (make_engine, RunnerConfig) take the dtype default on HF weights.
FOLLOWERS = ["test_engine.py", "test_compiled_step.py", "test_embeddings_engine.py", "test_fused_step.py",
             "test_heap.py", "test_scheduler.py", "test_fault_containment.py", "test_structured_output.py",
             "test_quantized.py"]


def test_the_runner_serves_hf_weights_as_the_flags_say(tiny_checkpoint):
    runner = ModelRunner(tiny_checkpoint, RunnerConfig(16, 4, "cpu", num_threads=1, step="eager"))
    bf16 = numerics.has_native_bf16(numerics.detect_cpu_flags())
    assert runner.dtype == runner.numerics.kv_cache_dtype == (torch.bfloat16 if bf16 else torch.float32)


@pytest.mark.timeout(900)  # ~1 min on 2 idle cores with a warm Inductor cache; compiling bf16 graphs cold adds some
def test_the_tests_that_take_the_defaults_pass_in_the_other_branch():
    other = PLAIN_CPU if numerics.has_native_bf16(numerics.detect_cpu_flags()) else BF16_CPU
    first = f"{Path(__file__).name}::test_the_runner_serves_hf_weights_as_the_flags_say"  # it says the branch taken
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu",
                          first, *FOLLOWERS], cwd=HERE, env={**os.environ, numerics.CPU_FLAGS_ENV: other},
                         capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, f"exit {run.returncode} with {numerics.CPU_FLAGS_ENV}={other!r}\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
    assert " passed" in run.stdout and " failed" not in run.stdout and " error" not in run.stdout, run.stdout[-2000:]
