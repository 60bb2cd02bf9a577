"""Static roofline: the bytes each kernel call must move and the operations it must do, and the floor.

    floor = max(bytes / 4.8 TB/s, ops / the rate of the units that do them)          (H200)

Bytes are compulsory traffic: every input read once, every output written once, nothing else
(no re-reads, no split-KV partials, no L2 reuse). Operations count a multiply-add as 2, on the
unit that runs them: attention's QK^T and PV on bf16 tensor cores (790 TFLOP/s, the dense bf16
matmul rate measured on this workplace's H200s; datasheet 989), elementwise fp32 math on CUDA
cores (132 SMs x 128 lanes x 2 x 1.98 GHz = 67 TFLOP/s), the sampler's counter hash on the INT32
units (132 x 64 x 1.98 GHz = 16.7 Tops/s; its ~130 ops per logit are counted from the kernel:
two lowbias32 rounds in int64 with 16-bit split multiplies, ~2 int32 instructions per int64 op,
plus two logs). 4.8 TB/s is the HBM3e datasheet rate; a device-to-device copy measured 4.3 TB/s
there, so ~90% of it is the practical ceiling. ``bench/kernels.py`` times the same shapes on the GPU
and reports achieved GB/s and the fraction of this floor; ``python -m bench.kernel_doc`` writes the
table into docs/kernels.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.shapes import DEFAULT, LLAMA_3_8B, ModelShape

HBM_BYTES_PER_S = 4.8e12
MATMUL_FLOP_PER_S = 790e12  # dense bf16 on tensor cores, measured
CEILINGS = {"tensor": MATMUL_FLOP_PER_S, "fp32": 67e12, "int32": 16.7e12}  # ops per second
SAMPLE_OPS_PER_LOGIT = 130  # the Gumbel draw's hash (see above); greedy rows do ~3
BF16 = 2  # bytes per element
FP32 = 4
PAGE = 16  # KV-cache block size (the engine's default)


@dataclass(frozen=True)
class Work:
    op: str
    shape: str
    bytes: float
    ops: float
    unit: str = "fp32"  # key of CEILINGS: which units do the ops

    @property
    def seconds(self) -> float:
        return max(self.bytes / HBM_BYTES_PER_S, self.ops / CEILINGS[self.unit])

    @property
    def bound(self) -> str:
        return "memory" if self.bytes / HBM_BYTES_PER_S >= self.ops / CEILINGS[self.unit] else self.unit


def rms_norm(tokens: int, model: ModelShape = DEFAULT, residual: bool = True) -> Work:
    # x (+ residual) read, out (+ new residual) written, the weight read once.
    rows = (4 if residual else 2) * tokens * model.hidden * BF16
    return Work("rms_norm", f"T={tokens} H={model.hidden}" + (" +residual" if residual else ""),
                rows + model.hidden * BF16, 4 * tokens * model.hidden)


def apply_rotary(tokens: int, model: ModelShape = DEFAULT) -> Work:
    # q and k rotated in place (read + write), one fp32 cos/sin row and an int64 position per token.
    heads = model.q_heads + model.kv_heads
    return Work("apply_rotary", f"T={tokens} Hq={model.q_heads} Hk={model.kv_heads} D={model.head_dim}",
                2 * tokens * heads * model.head_dim * BF16 + tokens * (model.head_dim * FP32 + 8),
                3 * tokens * heads * model.head_dim)


def store_kv(tokens: int, model: ModelShape = DEFAULT) -> Work:
    # k and v read from the qkv output, written into their cache slots; one int64 slot per token.
    return Work("store_kv", f"T={tokens} Hk={model.kv_heads} D={model.head_dim}",
                4 * tokens * model.kv_heads * model.head_dim * BF16 + 8 * tokens, 0)


def silu_and_mul(tokens: int, model: ModelShape = DEFAULT) -> Work:
    # gate and up read, their product written.
    return Work("silu_and_mul", f"T={tokens} F={model.ffn}", 3 * tokens * model.ffn * BF16, 6 * tokens * model.ffn)


def decode_attention(seqs: int, context: int, model: ModelShape = DEFAULT) -> Work:
    # Every cached key and value once, q in and out written, the block tables read.
    kv = 2 * seqs * context * model.kv_heads * model.head_dim * BF16
    q_out = 2 * seqs * model.q_heads * model.head_dim * BF16
    tables = seqs * math.ceil(context / PAGE) * 4
    return Work("decode attention", f"{model.name} B={seqs} ctx={_k(context)}", kv + q_out + tables,
                4 * seqs * model.q_heads * context * model.head_dim, "tensor")


def prefill_attention(tokens: int, model: ModelShape = DEFAULT) -> Work:
    # One prompt, causal: half of the T x T scores, QK^T and PV at 2 FLOPs per multiply-add each.
    heads = 2 * model.q_heads + 2 * model.kv_heads  # q in, out, k and v
    return Work("prefill attention", f"{model.name} prompt={_k(tokens)}", tokens * heads * model.head_dim * BF16,
                4 * model.q_heads * model.head_dim * tokens * tokens / 2, "tensor")


def sample(seqs: int, model: ModelShape = DEFAULT, greedy: bool = False) -> Work:
    # The Triton draw: fp32 logits read once, one int64 token written (the filters are torch ops).
    ops = (3 if greedy else SAMPLE_OPS_PER_LOGIT) * seqs * model.vocab
    return Work("sample " + ("(greedy)" if greedy else "(draw)"), f"B={seqs} V={model.vocab}",
                seqs * model.vocab * FP32 + 8 * seqs, ops, "fp32" if greedy else "int32")


def default_rows() -> list[Work]:
    """The default model's shapes (bf16), plus decode attention at Llama-3-8B's heads for scale."""
    rows = [rms_norm(t) for t in (1, 16, 256, 4096)]
    rows += [apply_rotary(t) for t in (1, 16, 256, 4096)]
    rows += [store_kv(t) for t in (1, 16, 256, 4096)]
    rows += [silu_and_mul(t) for t in (1, 16, 256, 4096)]
    rows += [decode_attention(b, c) for b in (1, 16, 64) for c in (512, 4096, 16384)]
    rows += [decode_attention(b, 16384, LLAMA_3_8B) for b in (1, 16)]
    rows += [prefill_attention(t) for t in (512, 2048)]
    rows += [sample(b, greedy=True) for b in (1, 16, 256)]
    rows += [sample(b) for b in (1, 16, 256)]
    return rows


def render(rows: list[Work]) -> str:
    lines = [
        "| op | shape (bf16) | bytes | ops (units) | ops/byte | bound | floor on H200 |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for w in rows:
        intensity = w.ops / w.bytes if w.bytes else 0.0
        lines.append(f"| {w.op} | {w.shape} | {_size(w.bytes)} | {_count(w.ops)} ({w.unit}) | {intensity:.1f} | "
                     f"{w.bound} | {_time(w.seconds)} |")
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} µs" if seconds >= 1e-6 else f"{seconds * 1e9:.3g} ns"
