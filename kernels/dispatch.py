"""``KernelOps``: the one object through which the model calls its hot-path ops.

    ops = KernelOps.create("cuda")                     # triton: the Triton kernels
    ops = KernelOps.create("cpu")                      # cpu: kernels/cpu's C++ ops (fused attention)
    ops = KernelOps.create("cpu", backend="reference") # reference: the plain-torch oracle (HF-exact fp32)
    ops = KernelOps.create("cpu", force_triton=True)   # triton through the interpreter; needs
                                                       # TRITON_INTERPRET=1 before triton is imported

Backends differ in ``attention`` (RoPE + KV-cache write + paged attention of one layer): one
fused C++ call on "cpu", the three separate ops elsewhere; and "cpu" draws all-greedy batches with
a vectorised C++ argmax (``greedy``, and ``sample`` when every row is greedy). The cheap
elementwise ops (rms_norm, silu_and_mul, gelu_tanh_and_mul) are the references on CPU; torch.compile fuses them into
the compiled step. ``decoder_stack`` (every decoder layer of a model whose projections are a GGUF's
block codes, in one C++ call: services/generation/fused_step.py) exists on "cpu" only; the other
backends raise NotImplementedError, and ``supports("decoder_stack")`` says so beforehand.
Triton and the C++ library are imported/loaded only inside ``create`` when chosen, so importing
this module costs torch only. The choice is logged once per ``create``. Shapes: T tokens in the
step, B sequences, Hq/Hk query/KV heads, D head dim, NB cache blocks of BS slots.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import reference
from kernels.reference import build_cos_sin_cache

logger = logging.getLogger(__name__)

BACKEND_REFERENCE = "reference"
BACKEND_CPU = "cpu"
BACKEND_TRITON = "triton"
BACKENDS = ("auto", BACKEND_CPU, BACKEND_REFERENCE, BACKEND_TRITON)


def _triton_impls() -> dict[str, Callable]:
    # Imported here, not at module top: CPU serving must not pay for importing Triton.
    from kernels.kv_cache import store_kv
    from kernels.paged_attention import paged_attention
    from kernels.rms_norm import rms_norm
    from kernels.rotary import apply_rotary
    from kernels.sampling import sample
    from kernels.swiglu import gelu_tanh_and_mul, silu_and_mul

    return {
        "gelu_tanh_and_mul": gelu_tanh_and_mul,
        "rms_norm": rms_norm,
        "apply_rotary": apply_rotary,
        "silu_and_mul": silu_and_mul,
        "store_kv": store_kv,
        "paged_attention": paged_attention,
        "sample": sample,
        "greedy": reference.greedy_ref,  # one argmax: nothing for a kernel to win
    }


def _reference_impls() -> dict[str, Callable]:
    return {
        "rms_norm": reference.rms_norm_ref,
        "apply_rotary": reference.apply_rotary_ref,
        "silu_and_mul": reference.silu_and_mul_ref,
        "gelu_tanh_and_mul": reference.gelu_tanh_and_mul_ref,
        "store_kv": reference.store_kv_ref,
        "paged_attention": reference.paged_attention_ref,
        "sample": reference.sample_ref,
        "greedy": reference.greedy_ref,
    }


def _cpu_impls() -> dict[str, Callable]:
    from kernels import cpu

    cpu.ensure_loaded()  # raises KernelBuildError when the library cannot be built here

    from kernels.reference.sampling import apply_sampling_filters

    def sample(logits, temperature, top_k, top_p, min_p, seeds, offsets):
        if not bool((temperature > 0).any()):  # every row greedy: the vectorised argmax
            return cpu.argmax_rows(logits)
        filtered = apply_sampling_filters(logits, temperature, top_k, top_p, min_p)
        return cpu.gumbel_argmax(filtered, temperature, seeds, offsets)  # draw_ref, hashing fewer tokens

    return _reference_impls() | {"attention": cpu.attention, "sample": sample, "greedy": cpu.greedy_rows,
                                 "decoder_stack": cpu.decoder_stack}


def _check_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "force_triton=True on a non-CUDA device runs Triton through its interpreter: set the "
            "environment variable TRITON_INTERPRET=1 before triton is imported (e.g. at the top of "
            "the test's conftest.py)"
        )
    if "triton" in sys.modules:
        # Triton reads the variable lazily today, but a stale import is the usual cause of
        # "0 active drivers" errors, so say so rather than fail deep inside a launch.
        logger.debug("triton was imported before KernelOps.create; TRITON_INTERPRET=1 is set")


@dataclass(frozen=True)
class KernelOps:
    """The hot-path ops bound to one backend ("cpu", "reference" or "triton") and device."""

    device: torch.device
    backend: str
    _impl: dict[str, Callable]

    @classmethod
    def create(cls, device: torch.device | str, backend: str = "auto", force_triton: bool = False) -> KernelOps:
        """backend auto: triton on CUDA, cpu on CPU. force_triton: Triton on CPU under the interpreter."""
        device = torch.device(device)
        if backend not in BACKENDS:
            raise ValueError(f"kernel backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if force_triton:
            backend = BACKEND_TRITON
        elif backend == "auto":
            backend = BACKEND_TRITON if device.type == "cuda" else BACKEND_CPU
        if backend == BACKEND_TRITON:
            if device.type != "cuda":
                _check_interpreter()
            ops = cls(device, BACKEND_TRITON, _triton_impls())
        elif backend == BACKEND_CPU:
            if device.type != "cpu":
                raise ValueError(f"the cpu kernel backend runs on CPU only, not {device}")
            ops = cls(device, BACKEND_CPU, _cpu_impls())  # KernelBuildError when it cannot be built here
        else:
            ops = cls(device, BACKEND_REFERENCE, _reference_impls())
        logger.info("kernel ops for %s: %s backend", device, ops.backend)
        return ops

    @staticmethod
    def build_cos_sin_cache(
        head_dim: int,
        max_positions: int,
        theta: float,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        llama3: dict[str, float] | None = None,
        freq_factors: tuple[float, ...] | None = None,
    ) -> torch.Tensor:  # [max_positions, head_dim] = cat(cos, sin)
        return build_cos_sin_cache(head_dim, max_positions, theta, device, dtype, llama3, freq_factors)

    def supports(self, op: str) -> bool:
        """Whether this backend runs op: every op runs on every backend but decoder_stack ("cpu" only)."""
        return op != "decoder_stack" or "decoder_stack" in self._impl

    def rms_norm(
        self,
        x: torch.Tensor,  # [T, H]
        weight: torch.Tensor,  # [H]
        eps: float,
        residual: torch.Tensor | None = None,  # [T, H]
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # out, or (out, x + residual)
        return self._impl["rms_norm"](x, weight, eps, residual)

    def apply_rotary(
        self,
        q: torch.Tensor,  # [T, Hq, D], rotated in place
        k: torch.Tensor,  # [T, Hk, D], rotated in place
        positions: torch.Tensor,  # [T] int64
        cos_sin_cache: torch.Tensor,  # [max_pos, D]
    ) -> None:
        self._impl["apply_rotary"](q, k, positions, cos_sin_cache)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:  # [T, 2F] -> [T, F]
        return self._impl["silu_and_mul"](x)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:  # [T, 2F] -> [T, F]: Gemma's GeGLU
        return self._impl["gelu_tanh_and_mul"](x)

    def store_kv(
        self,
        k: torch.Tensor,  # [T, Hk, D]
        v: torch.Tensor,  # [T, Hk, D]
        k_cache: torch.Tensor,  # [NB, BS, Hk, D]
        v_cache: torch.Tensor,  # [NB, BS, Hk, D]
        slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
    ) -> None:
        self._impl["store_kv"](k, v, k_cache, v_cache, slot_mapping)

    def paged_attention(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k_cache: torch.Tensor,  # [NB, BS, Hk, D]
        v_cache: torch.Tensor,  # [NB, BS, Hk, D]
        block_tables: torch.Tensor,  # [B, max_blocks] int32
        cu_seqlens_q: torch.Tensor,  # [B + 1] int32
        context_lens: torch.Tensor,  # [B] int32
        scale: float,
        window: int = 0,  # > 0: each row sees only its last `window` keys (sliding-window layers)
    ) -> torch.Tensor:  # [T, Hq, D]
        if window:  # no-window calls keep their recorded form (kernels/aot/kernel_calls.json)
            return self._impl["paged_attention"](q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                                 window)
        return self._impl["paged_attention"](q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)

    def attention(
        self,
        qkv: torch.Tensor,  # [T, (Hq + 2 Hk) D], the fused projection's output
        positions: torch.Tensor,  # [T] int64
        slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
        block_tables: torch.Tensor,  # [B, max_blocks] int32
        cu_seqlens_q: torch.Tensor,  # [B + 1] int32
        context_lens: torch.Tensor,  # [B] int32
        cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32
        k_cache: torch.Tensor,  # [NB, BS, Hk, D], written at slot_mapping
        v_cache: torch.Tensor,  # [NB, BS, Hk, D]
        num_heads: int,
        num_kv_heads: int,
        scale: float,
        window: int = 0,  # > 0: each row sees only its last `window` keys
    ) -> torch.Tensor:  # [T, Hq D]
        """One layer's attention: RoPE on q and k, store k and v in the cache, paged causal attention."""
        fused = self._impl.get("attention")
        if fused is not None:
            return fused(qkv.contiguous(), positions, cos_sin_cache, k_cache, v_cache, slot_mapping, block_tables,
                         cu_seqlens_q, context_lens, num_heads, num_kv_heads, scale, window)
        t, head_dim = qkv.shape[0], k_cache.shape[-1]
        q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
        q = q.view(t, num_heads, head_dim)  # [T, Hq, D] (strided views into qkv)
        k = k.view(t, num_kv_heads, head_dim)  # [T, Hk, D]
        v = v.view(t, num_kv_heads, head_dim)  # [T, Hk, D]
        self.apply_rotary(q, k, positions, cos_sin_cache)
        self.store_kv(k, v, k_cache, v_cache, slot_mapping)
        o = self.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                                 window)  # [T, Hq, D]
        return o.reshape(t, num_heads * head_dim)

    def sample(
        self,
        logits: torch.Tensor,  # [B, V] fp32
        temperature: torch.Tensor,  # [B]
        top_k: torch.Tensor,  # [B] int, 0 = off
        top_p: torch.Tensor,  # [B], 1 = off
        min_p: torch.Tensor,  # [B], 0 = off
        seeds: torch.Tensor,  # [B] int64
        offsets: torch.Tensor,  # [B] int64
    ) -> torch.Tensor:  # [B] int64
        return self._impl["sample"](logits, temperature, top_k, top_p, min_p, seeds, offsets)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] fp32 -> [B] int64
        """Each row's argmax (first index on ties), or -1 for a row holding a NaN or an infinity:
        the whole draw of an all-greedy batch, its finiteness check included."""
        return self._impl["greedy"](logits)

    def decoder_stack(
        self,
        h: torch.Tensor,  # [T, H] fp32, the step's embeddings
        norms: list[torch.Tensor],  # each layer's input and post-attention norm [H], then the final norm
        weights: list,  # each layer's qkv, o, gate_up and down projections as kernels.cpu.PackedWeight
        k_caches: list[torch.Tensor],  # per layer [NB, BS, Hk, D], written at slot_mapping
        v_caches: list[torch.Tensor],  # per layer [NB, BS, Hk, D]
        positions: torch.Tensor,  # [T] int64
        slot_mapping: torch.Tensor,  # [T] int64, -1 = skip
        block_tables: torch.Tensor,  # [B, max_blocks] int32, contiguous
        cu_seqlens_q: torch.Tensor,  # [B + 1] int32
        context_lens: torch.Tensor,  # [B] int32
        logits_indices: torch.Tensor,  # [S] int64
        cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32
        num_heads: int,
        num_kv_heads: int,
        scale: float,
        eps: float,
    ) -> torch.Tensor:  # [S, H] fp32 final hidden states (after the final norm) at logits_indices
        """Every decoder layer and the final norm in one call (the "cpu" backend's C++ op)."""
        fused = self._impl.get("decoder_stack")
        if fused is None:
            raise NotImplementedError(f"decoder_stack runs on the cpu kernel backend only, not {self.backend}")
        return fused(h, norms, weights, k_caches, v_caches, positions, slot_mapping, block_tables, cu_seqlens_q,
                     context_lens, logits_indices, cos_sin_cache, num_heads, num_kv_heads, scale, eps)
