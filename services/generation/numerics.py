"""What the generation service computes with: device, activation dtype, weight format, kernels.

Defaults follow the peers (llama.cpp, vLLM, TGI), each choice with its reason in one log line:

  * A GGUF serves at its own quantization: its block-quantized weights (Q4_0/1, Q4_K, Q5_0/1,
    Q5_K, Q8_0; weights/blocks.py) stay the file's codes and run through kernels/cpu's quantized
    matmul with int8 activations, as llama.cpp does; activations elsewhere fp32; the KV cache bf16
    (llama.cpp's is f16 by default): half the bytes of the largest allocation, read by the fused
    attention op in fp32. Other tensors (norms, Q6_K, ...) are dense.
  * HF safetensors: bf16 where the CPU computes bf16 natively (avx512_bf16 or AMX), else fp32: the
    one default that reads the CPU, through its flags (detect_cpu_flags, $MSTAR_CPU_FLAGS).
  * CUDA: bf16 and the Triton kernels; GGUF blocks are dequantized (no CUDA block kernel here).
  * ``--dtype float32 --quantization none`` on CPU is the exact Hugging Face oracle: the plain
    reference kernels, eager, token-identical to transformers (tests/unit/generation/test_parity.py).

Kernels: "cpu" (kernels/cpu C++ ops, the default on CPU), "reference" (the oracle) or "triton"
(CUDA). How a step runs over these numerics (eager, a graph, the fused stack) is step_choice.py's.
When the C++ ops cannot be built here (no compiler), CPU falls back to the reference kernels with
dense weights, and the log line says why.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from kernels.cpu import library as cpu_library
from services.generation.weights.checkpoint import Checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
QUANTIZATIONS = ("auto", "gguf", "none")
KERNELS = ("auto", "cpu", "reference", "triton")
CPU_FLAGS_ENV = "MSTAR_CPU_FLAGS"  # replaces /proc/cpuinfo's flags for the defaults (detect_cpu_flags)


@dataclass(frozen=True)
class Numerics:
    device: torch.device
    dtype: torch.dtype  # activations
    quantized: bool  # GGUF blocks served as codes through kernels/cpu quant_matmul
    kernels: str  # "cpu" | "reference" | "triton"
    weights: str  # what the weights are served as, e.g. "Q4_1 x210 + Q8_0 x1 as codes, float32 x61"
    reason: str  # why, in words
    kv_dtype: torch.dtype | None = None  # the KV cache's; None: the activations'

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        return self.kv_dtype or self.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def as_metadata(self, compiled_decode: bool) -> str:
        """JSON (ASCII) for the Stream's initial metadata; preprocess reports it in ListModels.
        compiled_decode: the runner's step is not the eager one (step_choice.py)."""
        return json.dumps({"device": self.device.type, "weights": self.weights, "activations": self.dtype_name,
                           "kv_cache": str(self.kv_cache_dtype).removeprefix("torch."),
                           "kernels": self.kernels, "compiled_decode": compiled_decode})

    def describe(self) -> str:
        """The start-up log line's numerics part (the runner adds the step)."""
        kv = str(self.kv_cache_dtype).removeprefix("torch.")
        return (f"numerics: {self.device.type}, weights {self.weights}, activations {self.dtype_name}, "
                f"KV cache {kv}, {self.kernels} kernels ({self.reason})")


def detect_cpu_flags() -> str:
    """This CPU's feature flags as /proc/cpuinfo lists them, or $MSTAR_CPU_FLAGS when set: the
    defaults of another CPU (tests pin it so that nothing they compare depends on the machine, and
    run the bf16 branch on CPUs without bf16). The kernel build never reads it: kernels/cpu/library.py
    compiles for the real CPU."""
    if CPU_FLAGS_ENV in os.environ:
        return os.environ[CPU_FLAGS_ENV]
    return cpu_library.detect_cpu_flags()


def has_native_bf16(cpu_flags: str) -> bool:
    """avx512_bf16 or AMX among the flags: the CPU multiplies bf16 in hardware (else bf16 matmuls are
    emulated, slower than fp32)."""
    found = set(cpu_flags.split())
    return "avx512_bf16" in found or "amx_bf16" in found


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _weights(checkpoint: Checkpoint, quantized: bool, dtype: torch.dtype) -> str:
    dense_name = str(dtype).removeprefix("torch.")
    counts: dict[str, int] = {}
    for b in checkpoint.blocks.values():
        key = f"{b.kind} codes" if quantized else dense_name
        counts[key] = counts.get(key, 0) + 1
    counts[dense_name] = counts.get(dense_name, 0) + len(checkpoint.tensors)
    return ", ".join(f"{k} x{n}" for k, n in counts.items() if n)


def choose(
    checkpoint: Checkpoint,
    device: str = "auto",
    dtype: str = "auto",
    quantization: str = "auto",
    kernels: str = "auto",
    cpu_flags: str | None = None,
    kv_cache_dtype: str = "auto",
    cpu_kernels_error: Exception | None = None,
) -> Numerics:
    """The numerics for this checkpoint on this machine. cpu_flags: the CPU's feature flags, the only
    thing a default reads about the CPU (None: detect_cpu_flags()). cpu_kernels_error: why
    kernels/cpu cannot load here (None: it can); callers pass kernels.cpu.load_error(). Raises
    ValueError for impossible explicit choices, naming the fix."""
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got {kernels!r}")
    if kv_cache_dtype not in ("auto", *DTYPES):
        raise ValueError(f"kv_cache_dtype must be one of auto, {', '.join(DTYPES)}; got {kv_cache_dtype!r}")
    dev = resolve_device(device)
    has_blocks = bool(checkpoint.blocks)
    reasons = []

    if dev.type == "cuda":
        if quantization == "gguf":
            raise ValueError("--quantization gguf runs on CPU only (kernels/cpu); on CUDA the blocks are dequantized")
        if kernels in ("cpu", "reference"):
            raise ValueError(f"--kernels {kernels} runs on CPU only; CUDA uses the Triton kernels")
        act = DTYPES[dtype] if dtype != "auto" else torch.bfloat16
        reasons.append("CUDA: Triton kernels" + (", GGUF blocks dequantized" if has_blocks else ""))
        return Numerics(dev, act, False, "triton", _weights(checkpoint, False, act), "; ".join(reasons))

    oracle = dtype == "float32" and quantization == "none" and kernels in ("auto", "reference")
    if oracle or kernels == "reference":
        kind = "reference"
        reasons.append("--dtype float32 --quantization none: the exact HF oracle" if oracle else "--kernels reference")
    elif kernels == "triton":
        kind = "triton"  # the interpreter (tests); dispatch checks TRITON_INTERPRET
    elif cpu_kernels_error is not None:
        if kernels == "cpu" or quantization == "gguf":
            raise ValueError(f"the CPU kernels cannot be built here: {cpu_kernels_error}")
        kind = "reference"
        reasons.append(f"kernels/cpu unavailable ({str(cpu_kernels_error).splitlines()[0]})")
    else:
        kind = "cpu"

    if quantization == "gguf" and not has_blocks:
        raise ValueError(f"--quantization gguf needs a GGUF with block-quantized weights; {checkpoint.source} has none")
    if quantization == "gguf" and kind != "cpu":
        raise ValueError(f"--quantization gguf needs the cpu kernels, not {kind}")
    quantized = has_blocks and kind == "cpu" and quantization != "none"
    if quantized:
        reasons.append("the GGUF's own block codes (int8-activation kernels, as llama.cpp)")

    if dtype != "auto":
        act = DTYPES[dtype]
    elif quantized or kind == "reference":
        act = torch.float32
    elif has_native_bf16(detect_cpu_flags() if cpu_flags is None else cpu_flags):
        act = torch.bfloat16
        reasons.append("CPU has native bf16 (avx512_bf16/AMX)")
    else:
        act = torch.float32
        reasons.append("no native bf16 on this CPU: fp32")
    if kv_cache_dtype != "auto":
        kv = DTYPES[kv_cache_dtype]
        if kind == "reference" and kv != act:
            raise ValueError("--kv-cache-dtype other than --dtype needs the cpu kernels (the oracle keeps one dtype)")
    else:
        kv = torch.bfloat16 if quantized else act  # the GGUF default: bf16 KV, as llama.cpp's f16
    return Numerics(dev, act, quantized, kind, _weights(checkpoint, quantized, act), "; ".join(reasons),
                    kv_dtype=kv)
