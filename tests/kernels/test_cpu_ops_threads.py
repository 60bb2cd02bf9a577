"""kernels/cpu's ops with several OpenMP threads, as a server with more cores runs them.

The other kernel tests run on one thread, where at::parallel_for calls its body on the calling
thread. With more threads the body runs on workers, and a `thread_local` named inside the lambda
is the worker's own copy, not the caller's: attention read an empty work list there and segfaulted
(found by the benchmark at --threads 2). A crash would take the whole test session down, so the
op tests run again in a child pytest with 4 threads and the verdict is its exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import cpu

pytestmark = pytest.mark.skipif(cpu.load_error() is not None, reason=f"kernels/cpu unavailable: {cpu.load_error()}")


def test_the_cpu_ops_give_their_references_results_on_four_threads():
    module = Path(__file__).with_name("test_cpu_ops.py")
    env = {**os.environ, "MSTAR_TEST_THREADS": "4"}
    selected = "quant_matmul_is_its_reference or fused_attention_is_rotary_store_and_paged_attention"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selected, str(module)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode} (negative: killed by that signal)\n{run.stdout[-3000:]}{run.stderr[-2000:]}"
