"""Default numerics like the peers' (numerics.py) and threads from the machine (threads.py)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from services.generation import numerics
from services.generation.model_runner import ModelRunner, RunnerConfig
from services.generation.models.block_weight import BlockWeight
from services.generation.numerics import choose
from services.generation.threads import default_threads, usable_cpus
from services.generation.weights.checkpoint import Checkpoint
from services.generation.weights.random_init import TINY, random_checkpoint

BF16_CPU = "fpu avx2 avx512f avx512_bf16 avx512_vnni"
AMX_CPU = "fpu avx2 avx512f avx512_vnni amx_bf16 amx_tile"
PLAIN_CPU = "fpu avx2 avx512f avx512_vnni"


@pytest.fixture(scope="module")
def hf_checkpoint() -> Checkpoint:
    return random_checkpoint(TINY, seed=0)


@pytest.fixture(scope="module")
def gguf_checkpoint(hf_checkpoint) -> Checkpoint:
    """The tiny model with its projections as Q4_1-like blocks, as a GGUF loads."""
    blocks, tensors = {}, {}
    for name, w in hf_checkpoint.tensors.items():
        if name.endswith("proj.weight"):
            n, k = w.shape
            blocks[name] = BlockWeight("Q4_1", torch.randint(0, 16, (n, k), dtype=torch.uint8),
                                       torch.full((n, k // 32), 0.01), torch.full((n, k // 32), -0.08))
        else:
            tensors[name] = w
    return Checkpoint("tiny-gguf", "tiny.gguf", TINY, tensors, blocks)


def test_a_gguf_serves_its_own_codes_by_default(gguf_checkpoint):
    n = choose(gguf_checkpoint, cpu_flags=PLAIN_CPU)
    assert (n.quantized, n.kernels, n.dtype) == (True, "cpu", torch.float32)
    assert n.weights == "Q4_1 codes x14, float32 x7"
    assert "own block codes" in n.reason
    assert n.kv_cache_dtype == torch.bfloat16  # llama.cpp's cache is f16: half the bytes of fp32


def test_the_kv_cache_follows_the_activations_unless_told(hf_checkpoint, gguf_checkpoint):
    assert choose(hf_checkpoint, cpu_flags=PLAIN_CPU).kv_cache_dtype == torch.float32
    assert choose(hf_checkpoint, cpu_flags=BF16_CPU).kv_cache_dtype == torch.bfloat16
    oracle = choose(gguf_checkpoint, dtype="float32", quantization="none")
    assert oracle.kv_cache_dtype == torch.float32  # the oracle keeps fp32 everywhere
    assert choose(gguf_checkpoint, kv_cache_dtype="float32").kv_cache_dtype == torch.float32
    assert choose(hf_checkpoint, cpu_flags=PLAIN_CPU, kv_cache_dtype="bfloat16").kv_cache_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="needs the cpu kernels"):
        choose(gguf_checkpoint, dtype="float32", quantization="none", kv_cache_dtype="bfloat16")
    with pytest.raises(ValueError, match="auto, float32, bfloat16.*'fp8'"):
        choose(gguf_checkpoint, kv_cache_dtype="fp8")


@pytest.mark.parametrize(("flags", "dtype"), [(BF16_CPU, torch.bfloat16), (AMX_CPU, torch.bfloat16),
                                            (PLAIN_CPU, torch.float32), ("", torch.float32)])
def test_hf_weights_serve_in_bf16_only_where_the_cpu_has_it(hf_checkpoint, flags, dtype):
    n = choose(hf_checkpoint, cpu_flags=flags)
    assert (n.quantized, n.kernels, n.dtype) == (False, "cpu", dtype)
    assert ("native bf16" if dtype == torch.bfloat16 else "no native bf16") in n.reason
    assert numerics.has_native_bf16(flags) == (dtype == torch.bfloat16)


@pytest.mark.parametrize("flags", [BF16_CPU, PLAIN_CPU])
def test_no_other_default_reads_the_cpu(hf_checkpoint, gguf_checkpoint, flags):
    """Only HF weights' activations follow the flags: a GGUF's numerics and the oracle are the same on every CPU."""
    assert choose(gguf_checkpoint, cpu_flags=flags) == choose(gguf_checkpoint, cpu_flags="")
    for checkpoint in (hf_checkpoint, gguf_checkpoint):
        oracle = choose(checkpoint, dtype="float32", quantization="none", cpu_flags=flags)
        assert oracle == choose(checkpoint, dtype="float32", quantization="none", cpu_flags="")
        assert (oracle.dtype, oracle.kv_cache_dtype) == (torch.float32, torch.float32)


def test_the_flags_come_from_cpuinfo_unless_pinned(hf_checkpoint, monkeypatch):
    monkeypatch.setenv(numerics.CPU_FLAGS_ENV, BF16_CPU)  # what the runner's choose(cpu_flags=None) reads
    assert numerics.detect_cpu_flags() == BF16_CPU and choose(hf_checkpoint).dtype == torch.bfloat16
    monkeypatch.setenv(numerics.CPU_FLAGS_ENV, "")
    assert choose(hf_checkpoint).dtype == torch.float32
    monkeypatch.delenv(numerics.CPU_FLAGS_ENV)
    with open("/proc/cpuinfo") as f:
        line = next(line for line in f if line.startswith("flags"))
    assert numerics.detect_cpu_flags().split() == line.split(":", 1)[1].split()


@pytest.mark.parametrize("fixture", ["hf_checkpoint", "gguf_checkpoint"])
def test_float32_without_quantization_is_the_eager_hf_oracle(request, fixture):
    n = choose(request.getfixturevalue(fixture), dtype="float32", quantization="none", cpu_flags=BF16_CPU)
    assert (n.quantized, n.kernels, n.dtype) == (False, "reference", torch.float32)
    assert "oracle" in n.reason


def test_without_the_cpu_kernels_a_gguf_falls_back_to_dense_reference(gguf_checkpoint):
    n = choose(gguf_checkpoint, cpu_kernels_error=RuntimeError("no C++ compiler found\nmore"))
    assert (n.quantized, n.kernels) == (False, "reference")
    assert "no C++ compiler found" in n.reason and "more" not in n.reason
    with pytest.raises(ValueError, match="cannot be built here: no C\\+\\+ compiler"):
        choose(gguf_checkpoint, quantization="gguf", cpu_kernels_error=RuntimeError("no C++ compiler found"))


def test_impossible_choices_are_refused_naming_the_fix(hf_checkpoint, gguf_checkpoint):
    with pytest.raises(ValueError, match="block-quantized weights"):
        choose(hf_checkpoint, quantization="gguf")
    with pytest.raises(ValueError, match="needs the cpu kernels"):
        choose(gguf_checkpoint, quantization="gguf", kernels="reference")
    with pytest.raises(ValueError, match="auto, float32, bfloat16.*'fp8'"):
        choose(hf_checkpoint, dtype="fp8")
    with pytest.raises(ValueError, match="auto, gguf, none"):
        choose(hf_checkpoint, quantization="awq")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.gpu
def test_cuda_is_bf16_triton_with_blocks_dequantized(gguf_checkpoint):
    n = choose(gguf_checkpoint, device="cuda")
    assert (n.quantized, n.kernels, n.dtype) == (False, "triton", torch.bfloat16)


def test_the_runner_logs_one_line_and_reports_its_numerics(gguf_checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="services.generation.model_runner"):
        runner = ModelRunner(gguf_checkpoint, RunnerConfig(32, 4, "cpu", num_threads=1))
    records = [r for r in caplog.records if r.getMessage().startswith("numerics:")]
    lines = [r.getMessage() for r in records]
    assert len(lines) == 1 and "Q4_1 codes x14" in lines[0] and "cpu kernels" in lines[0], lines
    assert "; step fused: a GGUF's codes in fp32" in lines[0] and records[0].step == "fused", lines
    assert json.loads(runner.numerics_metadata()) == {
        "device": "cpu", "weights": "Q4_1 codes x14, float32 x7", "activations": "float32", "kernels": "cpu",
        "compiled_decode": True, "kv_cache": "bfloat16"}
    eager = ModelRunner(gguf_checkpoint, RunnerConfig(32, 4, "cpu", num_threads=1, step="eager"))
    assert json.loads(eager.numerics_metadata())["compiled_decode"] is False


def _cgroup(tmp_path, v2: str | None = None, v1: tuple[int, int] | None = None):
    tmp_path.mkdir()
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2)
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(str(v1[0]))
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(str(v1[1]))
    return tmp_path


def test_usable_cpus_is_the_affinity_capped_by_the_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)))
    assert usable_cpus(_cgroup(tmp_path / "a", v2="max 100000")) == 32
    assert usable_cpus(_cgroup(tmp_path / "b", v2="400000 100000")) == 4
    assert usable_cpus(_cgroup(tmp_path / "c", v1=(250000, 100000))) == 2.5
    assert usable_cpus(_cgroup(tmp_path / "d", v1=(-1, 100000))) == 32
    assert usable_cpus(tmp_path / "missing") == 32
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert usable_cpus(_cgroup(tmp_path / "e", v2="800000 100000")) == 2  # the affinity mask is smaller


@pytest.mark.parametrize(("usable", "threads"), [(1, 1), (1.5, 1), (2, 2), (4, 4), (7.5, 7), (8, 7), (16, 14), (32, 28)])
def test_default_threads_leave_room_for_envoy_and_preprocess(usable, threads):
    assert default_threads(usable) == threads
