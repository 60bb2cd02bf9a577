"""Triton kernel benchmarks on the GPU: achieved GB/s or TFLOP/s and the fraction of the H200 peak.

    python -m bench.kernels [--quick] [--out docs/kernels.md]

For each op, over decode-sized batches (1-256 sequences, 512-32k context) and two head layouts
(SmolLM2-135M: Hq 9 / Hk 3 / D 64, Llama-3-8B: 32 / 8 / 128), times the Triton kernel, the torch
reference and, for attention, torch.nn.functional.scaled_dot_product_attention over the same keys
stored contiguously (the dense baseline a paged kernel should approach) with
triton.testing.do_bench (median ms). Memory-bound ops report GB/s of compulsory traffic (each input
read once, each output written once) against 4.8 TB/s; the prefill chunk reports TFLOP/s against
989 dense bf16 TFLOP/s. The markdown table replaces the results section of docs/kernels.md.
Exits with a message when there is no CUDA device: the numbers mean nothing under the interpreter.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

PEAK_BYTES_PER_S = 4.8e12  # H200 HBM3e
PEAK_FLOP_PER_S = 989e12  # H200 dense bf16
HEADS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}
MODEL_DIMS = {"smollm2": (576, 1536), "llama8b": (4096, 14336)}  # hidden, intermediate
MAX_CACHE_BYTES = 8 * 2**30  # skip shapes whose K+V cache would exceed this
MAX_REF_BYTES = 2 * 2**30  # the reference gathers a copy of the keys: only time it below this
BLOCK_SIZE = 16
DTYPE = torch.bfloat16
START, END = "<!-- results:start -->", "<!-- results:end -->"


@dataclass
class Row:
    op: str
    shape: str
    impl: str
    ms: float
    work: float  # bytes or FLOPs per call
    unit: str  # "GB/s" or "TFLOP/s"

    def cells(self) -> list[str]:
        rate = self.work / (self.ms * 1e-3)
        peak = PEAK_BYTES_PER_S if self.unit == "GB/s" else PEAK_FLOP_PER_S
        scale = 1e9 if self.unit == "GB/s" else 1e12
        return [self.op, self.shape, self.impl, f"{self.ms * 1e3:.1f}", f"{rate / scale:,.1f} {self.unit}", f"{100 * rate / peak:.1f}%"]


def _time(fn: Callable[..., object], *args, **kwargs) -> float:
    """Median milliseconds of fn(*args, **kwargs) (arguments bound now, not at a later lookup)."""
    from triton.testing import do_bench

    return do_bench(lambda: fn(*args, **kwargs), warmup=10, rep=40)


def _elt() -> int:
    return torch.tensor([], dtype=DTYPE).element_size()


def bench_rms_norm(rows: list[Row], quick: bool) -> None:
    from kernels.reference import rms_norm_ref
    from kernels.rms_norm import rms_norm

    for model, (hidden, _) in MODEL_DIMS.items():
        for n in (1, 256) if quick else (1, 64, 256, 4096):
            x, r = torch.randn(n, hidden, device="cuda", dtype=DTYPE), torch.randn(n, hidden, device="cuda", dtype=DTYPE)
            w = torch.randn(hidden, device="cuda", dtype=DTYPE)
            work = (4 * n * hidden + hidden) * _elt()  # x, residual read; out, new residual written
            shape = f"{model} T={n} H={hidden} +residual"
            rows.append(Row("rms_norm", shape, "triton", _time(rms_norm, x, w, 1e-5, r), work, "GB/s"))
            rows.append(Row("rms_norm", shape, "torch ref", _time(rms_norm_ref, x, w, 1e-5, r), work, "GB/s"))


def bench_silu_and_mul(rows: list[Row], quick: bool) -> None:
    from kernels.reference import silu_and_mul_ref
    from kernels.swiglu import silu_and_mul

    for model, (_, ffn) in MODEL_DIMS.items():
        for n in (1, 256) if quick else (1, 64, 256, 4096):
            x = torch.randn(n, 2 * ffn, device="cuda", dtype=DTYPE)
            work = 3 * n * ffn * _elt()
            shape = f"{model} T={n} F={ffn}"
            rows.append(Row("silu_and_mul", shape, "triton", _time(silu_and_mul, x), work, "GB/s"))
            rows.append(Row("silu_and_mul", shape, "torch ref", _time(silu_and_mul_ref, x), work, "GB/s"))


def bench_rotary(rows: list[Row], quick: bool) -> None:
    from kernels.reference import apply_rotary_ref, build_cos_sin_cache
    from kernels.rotary import apply_rotary

    for model, (hq, hk, d) in HEADS.items():
        cache = build_cos_sin_cache(d, 32768, 500000.0, device="cuda")
        for n in (1, 256) if quick else (1, 64, 256, 4096):
            qkv = torch.randn(n, (hq + 2 * hk) * d, device="cuda", dtype=DTYPE)
            q, k = qkv[:, : hq * d].view(n, hq, d), qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
            pos = torch.randint(0, 32768, (n,), device="cuda")
            work = 2 * n * (hq + hk) * d * _elt() + n * d * 4 + n * 8  # q, k in and out; cache rows; positions
            shape = f"{model} T={n}"
            rows.append(Row("apply_rotary", shape, "triton", _time(apply_rotary, q, k, pos, cache), work, "GB/s"))
            rows.append(Row("apply_rotary", shape, "torch ref", _time(apply_rotary_ref, q, k, pos, cache), work, "GB/s"))


def bench_store_kv(rows: list[Row], quick: bool) -> None:
    from kernels.kv_cache import store_kv
    from kernels.reference import store_kv_ref

    for model, (_, hk, d) in HEADS.items():
        kc = torch.empty(8192, BLOCK_SIZE, hk, d, device="cuda", dtype=DTYPE)
        vc = torch.empty_like(kc)
        for n in (1, 256) if quick else (1, 64, 256, 4096):
            k, v = torch.randn(n, hk, d, device="cuda", dtype=DTYPE), torch.randn(n, hk, d, device="cuda", dtype=DTYPE)
            slots = torch.randperm(kc.shape[0] * BLOCK_SIZE, device="cuda")[:n]
            work = 4 * n * hk * d * _elt() + 8 * n  # k, v read and written; slots
            shape = f"{model} T={n}"
            rows.append(Row("store_kv", shape, "triton", _time(store_kv, k, v, kc, vc, slots), work, "GB/s"))
            rows.append(Row("store_kv", shape, "torch ref", _time(store_kv_ref, k, v, kc, vc, slots), work, "GB/s"))


def _paged_cache(n_seqs: int, ctx: int, hk: int, d: int):
    blocks_per_seq = -(-ctx // BLOCK_SIZE)
    n_blocks = n_seqs * blocks_per_seq
    kc = torch.randn(n_blocks, BLOCK_SIZE, hk, d, device="cuda", dtype=DTYPE)
    vc = torch.randn_like(kc)
    tables = torch.randperm(n_blocks, device="cuda").to(torch.int32).view(n_seqs, blocks_per_seq)
    return kc, vc, tables


def bench_decode_attention(rows: list[Row], quick: bool) -> None:
    from kernels.paged_attention import paged_attention
    from kernels.reference import paged_attention_ref

    for model, (hq, hk, d) in HEADS.items():
        for n_seqs in (1, 64) if quick else (1, 16, 64, 256):
            for ctx in (512, 32768) if quick else (512, 4096, 32768):
                kv_bytes = 2 * n_seqs * ctx * hk * d * _elt()
                if kv_bytes > MAX_CACHE_BYTES:
                    continue
                kc, vc, tables = _paged_cache(n_seqs, ctx, hk, d)
                q = torch.randn(n_seqs, hq, d, device="cuda", dtype=DTYPE)
                cu = torch.arange(n_seqs + 1, device="cuda", dtype=torch.int32)
                lens = torch.full((n_seqs,), ctx, device="cuda", dtype=torch.int32)
                args = (q, kc, vc, tables, cu, lens, d**-0.5)
                work = kv_bytes + 2 * q.numel() * _elt()  # every key and value once; q in, out
                shape = f"{model} B={n_seqs} ctx={ctx}"
                rows.append(Row("decode attention", shape, "triton", _time(paged_attention, *args), work, "GB/s"))
                if kv_bytes <= MAX_REF_BYTES:
                    rows.append(Row("decode attention", shape, "torch ref", _time(paged_attention_ref, *args), work, "GB/s"))
                # Dense baseline: the same keys already contiguous, [B, Hk, ctx, D].
                kd = kc[tables.long()].reshape(n_seqs, -1, hk, d)[:, :ctx].transpose(1, 2).contiguous()
                vd = vc[tables.long()].reshape(n_seqs, -1, hk, d)[:, :ctx].transpose(1, 2).contiguous()
                qd = q[:, :, None, :]  # [B, Hq, 1, D]
                sdpa_ms = _time(F.scaled_dot_product_attention, qd, kd, vd, scale=d**-0.5, enable_gqa=True)
                rows.append(Row("decode attention", shape, "sdpa (dense)", sdpa_ms, work, "GB/s"))
                del kc, vc, kd, vd
                torch.cuda.empty_cache()


def bench_prefill_attention(rows: list[Row], quick: bool) -> None:
    from kernels.paged_attention import paged_attention
    from kernels.reference import paged_attention_ref

    for model, (hq, hk, d) in HEADS.items():
        for n_tok in (2048,) if quick else (512, 2048, 8192):
            kc, vc, tables = _paged_cache(1, n_tok, hk, d)
            q = torch.randn(n_tok, hq, d, device="cuda", dtype=DTYPE)
            cu = torch.tensor([0, n_tok], device="cuda", dtype=torch.int32)
            lens = torch.tensor([n_tok], device="cuda", dtype=torch.int32)
            args = (q, kc, vc, tables, cu, lens, d**-0.5)
            work = 2 * 2 * hq * d * n_tok * n_tok / 2  # QK^T and PV, causal half
            shape = f"{model} prompt={n_tok}"
            rows.append(Row("prefill attention", shape, "triton", _time(paged_attention, *args), work, "TFLOP/s"))
            rows.append(Row("prefill attention", shape, "torch ref", _time(paged_attention_ref, *args), work, "TFLOP/s"))
            kd = kc[tables.long()].reshape(1, -1, hk, d)[:, :n_tok].transpose(1, 2).contiguous()
            vd = vc[tables.long()].reshape(1, -1, hk, d)[:, :n_tok].transpose(1, 2).contiguous()
            qd = q.transpose(0, 1)[None]  # [1, Hq, T, D]
            sdpa_ms = _time(F.scaled_dot_product_attention, qd, kd, vd, is_causal=True, scale=d**-0.5, enable_gqa=True)
            rows.append(Row("prefill attention", shape, "sdpa (dense)", sdpa_ms, work, "TFLOP/s"))


def bench_sample(rows: list[Row], quick: bool) -> None:
    from kernels.reference import sample_ref
    from kernels.sampling import sample

    for vocab in (49152, 128256):
        for n in (1, 256) if quick else (1, 64, 256):
            logits = torch.randn(n, vocab, device="cuda")
            for label, top_k, top_p in (("temperature only", 0, 1.0), ("top-k 50 + top-p 0.9", 50, 0.9)):
                params = (
                    torch.full((n,), 0.8, device="cuda"), torch.full((n,), top_k, device="cuda"),
                    torch.full((n,), top_p, device="cuda"), torch.zeros(n, device="cuda"),
                    torch.arange(n, device="cuda"), torch.zeros(n, dtype=torch.int64, device="cuda"),
                )
                work = n * vocab * 4  # logits read once (the filters' sort is extra traffic)
                shape = f"B={n} V={vocab} {label}"
                rows.append(Row("sample", shape, "triton draw", _time(sample, logits, *params), work, "GB/s"))
                rows.append(Row("sample", shape, "torch ref", _time(sample_ref, logits, *params), work, "GB/s"))


def render(rows: list[Row], device_name: str) -> str:
    header = ["op", "shape", "impl", "µs", "achieved", "of H200 peak"]
    lines = [
        f"Measured on **{device_name}** with `python -m bench.kernels` (bf16, page size {BLOCK_SIZE}, "
        "triton.testing.do_bench median). Peak: 4.8 TB/s HBM, 989 dense bf16 TFLOP/s.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def write_results(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else f"# Kernels\n\n## Results\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text += f"\n## Results\n\n{START}\n{END}\n"
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: f"{START}\n{table}\n{END}", text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes (about a minute)")
    parser.add_argument("--out", type=Path, default=Path("docs/kernels.md"), help="markdown file to update")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/kernels.py measures Triton kernels on a CUDA GPU; none is visible to torch here.", file=sys.stderr)
        return 2
    rows: list[Row] = []
    for bench in (bench_rms_norm, bench_silu_and_mul, bench_rotary, bench_store_kv,
                  bench_decode_attention, bench_prefill_attention, bench_sample):
        bench(rows, args.quick)
        print(f"{bench.__name__}: done ({len(rows)} rows)", file=sys.stderr, flush=True)
    table = render(rows, torch.cuda.get_device_name())
    print(table)
    write_results(args.out, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
