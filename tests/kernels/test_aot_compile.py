"""The AOT compile gate: every launch the engine can make compiles for sm_90 and sm_80 within limits.

The gate needs Triton's real JIT functions, but this directory's conftest turns the interpreter on
(when there is no GPU) before Triton is imported, so it runs in a subprocess with TRITON_* cleared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HAS_CUDA

from kernels.aot import limits

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _python(*args: str, timeout: float = 280) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def gate_run(tmp_path_factory):
    """One gate run over the whole matrix: (the process, its report)."""
    report = tmp_path_factory.mktemp("aot") / "report.json"
    run = _python("-m", "kernels.aot", "--jobs", "2", "--report", str(report))
    return run, report


def test_every_engine_launch_compiles_for_hopper_and_ampere(gate_run):
    run, report = gate_run
    assert run.returncode == 0, run.stdout + run.stderr
    outcomes = json.loads(report.read_text())
    # The matrix covers what the launchers branch on, on both targets.
    attention = [o for o in outcomes if o["kernel"] == "_paged_attention_kernel"]
    assert {o["arch"] for o in outcomes} == {"sm_90", "sm_80"}
    assert {o["dtype"] for o in attention} == {"bf16", "fp16", "fp32"}

    assert {o["meta"]["BLOCK_D"] for o in attention} == {64, 128, 256}  # 256: Gemma 3
    assert {o["meta"]["WINDOWED"] for o in attention} == {True, False}
    assert {o["meta"]["GROUP_PAD"] for o in attention} == {1, 4, 8}
    assert {o["meta"]["SPLIT"] for o in attention} == {True, False}
    assert {o["meta"]["BLOCK_Q"] * o["meta"]["GROUP_PAD"] for o in attention} == {16, 32, 64}  # decode, prefill
    assert {o["kernel"] for o in outcomes} == {
        "_rms_norm_kernel", "_rotary_kernel", "_silu_and_mul_kernel", "_store_kv_kernel",
        "_paged_attention_kernel", "_reduce_splits_kernel", "_sample_kernel",
    }
    # Each run recompiles the default model's bf16 kernels and checks the ledger against them.
    fresh = [o for o in outcomes if o["compiled"]]
    assert fresh and all("SmolLM2-135M" in o["models"] and "bf16" in o["dtype"] for o in fresh)
    assert all(not o["problems"] and not o["disagreements"] for o in outcomes)


def test_docs_tables_are_generated_from_the_gate_and_the_roofline(gate_run):
    _, report = gate_run
    run = _python("-m", "bench.kernel_doc", "--check", "--report", str(report), timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def _config(key: str, kernel: str = "_rms_norm_kernel", models=("Llama-3-8B",)):
    from kernels.aot.build import Spec
    from kernels.aot.gate import Config

    spec = Spec("kernels.rms_norm", kernel, "sm_90", {}, {}, {}, {"num_warps": 4, "num_stages": 1}, key)
    return Config(spec, limits.BY_ARCH["sm_90"], {}, set(models), {"bf16"})


def test_the_ledger_is_reused_checked_by_fresh_compiles_and_never_trusted_over_them(monkeypatch):
    from kernels.aot import gate
    from kernels.aot.build import Resources

    compiled = []

    def fake_compile(specs, jobs):  # what ptxas "reports"; key "bad" comes back under another hash
        compiled.extend(s.key for s in specs)
        return {s.key: (Resources(regs=40), 0.1, "elsewhere" if s.key == "bad" else s.key) for s in specs}

    monkeypatch.setattr(gate, "_compile_all", fake_compile)
    configs = [_config("known"), _config("new"), _config("spot", models=("SmolLM2-135M",)), _config("bad")]
    stored = {"known": Resources(regs=48), "spot": Resources(regs=32)}
    outcomes = {o.config.spec.key: o for o in gate.evaluate(configs, stored, jobs=1)}
    assert sorted(compiled) == ["bad", "new", "spot"]  # the ledger's entry is reused, the spot check is not
    assert outcomes["known"].resources == Resources(regs=48) and not outcomes["known"].compiled
    assert "the ledger says" in outcomes["spot"].disagreements[0]
    assert "not the key" in outcomes["bad"].disagreements[0]
    assert not outcomes["new"].disagreements and not outcomes["new"].problems
    missing, stale = gate.ledger_diff(configs, stored | {"gone": Resources(regs=1)})
    assert [c.spec.key for c in missing] == ["new", "bad"] and stale == {"gone"}


def test_the_gate_rejects_what_the_interpreter_accepts():
    code = (
        "import json, aot_fixtures as f\n"
        "from kernels.aot import build, limits\n"
        "out = {}\n"
        "for launch in (f.annotated_global_launch()[0], f.spilling_launch()):\n"
        "    spec = build.spec_for(launch, 'sm_90')\n"
        "    resources, _, _ = build.compile_spec(spec)\n"
        "    out[launch.name] = limits.violations(spec.kernel, launch.meta, launch.num_warps, resources, limits.BY_ARCH['sm_90'])\n"
        "print(json.dumps(out))\n"
    )
    run = _python("-c", code)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["_annotated_global_kernel"][0].startswith("does not compile")
    assert "Cannot access global variable _SCALE" in found["_annotated_global_kernel"][0]
    assert any(p.startswith("spills") for p in found["_spilling_kernel"])
    assert any("stack frame" in p for p in found["_spilling_kernel"])


@pytest.mark.interpreter
@pytest.mark.skipif(HAS_CUDA, reason="shows the interpreter's leniency; on a GPU the kernel does not compile")
def test_the_interpreter_runs_the_kernel_the_compiler_rejects():
    import aot_fixtures

    launch, x, out = aot_fixtures.annotated_global_launch("cpu")
    launch()
    torch.testing.assert_close(out, x * 3)


@pytest.mark.parametrize(("need", "bound"), [(32, 64), (16, 128), (8, 255)])
def test_register_bound_follows_the_occupancy_target(need, bound):
    assert limits.register_bound(need) == bound
    gpu = limits.BY_ARCH["sm_90"]
    assert limits.resident_warps(bound, 0, 4, gpu)[0] >= need
    assert limits.resident_warps(bound + 8, 0, 4, gpu)[0] < need or bound == 255


def test_resident_warps_counts_shared_memory_and_the_reserved_kilobyte():
    a100, h100 = limits.BY_ARCH["sm_80"], limits.BY_ARCH["sm_90"]
    assert limits.resident_warps(64, 40 * 1024, 4, a100) == (16, "smem")  # 164 KB / 41 KB = 4 programs
    assert limits.resident_warps(64, 40 * 1024, 4, h100) == (20, "smem")  # 228 KB / 41 KB = 5
    assert limits.resident_warps(24, 0, 4, h100) == (64, "warps")
    assert limits.resident_warps(255, 0, 8, h100) == (8, "regs")


def test_a_stack_frame_or_too_much_shared_memory_fails():
    from kernels.aot.build import Resources

    h100 = limits.BY_ARCH["sm_90"]
    assert limits.violations("_rms_norm_kernel", {}, 4, Resources(regs=40), h100) == []
    assert "stack frame" in limits.violations("_rms_norm_kernel", {}, 4, Resources(regs=40, stack=16), h100)[0]
    over = limits.violations("_rms_norm_kernel", {}, 4, Resources(regs=40, smem=240 * 1024), h100)
    assert any("shared memory" in p for p in over)
