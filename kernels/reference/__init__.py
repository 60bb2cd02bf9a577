"""Plain-torch references of every kernel op.

The oracle the serving kernels are tested against (kernels/cpu on CPU, Triton on CUDA), written to
be read, and the engine's exact-Hugging-Face path: ``--dtype float32 --quantization none`` on CPU
runs these ops eagerly and is token-identical to transformers. No hidden state, no tuning: every
call derives what it needs from its arguments. Torch only: no Triton import here.
"""

from kernels.reference.kv_cache import store_kv_ref
from kernels.reference.paged_attention import paged_attention_ref
from kernels.reference.quant_matmul import quant_matmul_ref
from kernels.reference.rms_norm import rms_norm_ref
from kernels.reference.rotary import apply_rotary_ref, build_cos_sin_cache
from kernels.reference.sampling import greedy_ref, sample_ref
from kernels.reference.swiglu import gelu_tanh_and_mul_ref, silu_and_mul_ref

__all__ = [
    "apply_rotary_ref",
    "build_cos_sin_cache",
    "gelu_tanh_and_mul_ref",
    "greedy_ref",
    "paged_attention_ref",
    "quant_matmul_ref",
    "rms_norm_ref",
    "sample_ref",
    "silu_and_mul_ref",
    "store_kv_ref",
]
