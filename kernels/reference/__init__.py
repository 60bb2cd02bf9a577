"""Plain-torch references of every kernel op.

They are the CPU production path and the oracle for the Triton kernels, written to be read and to
match Hugging Face transformers' Llama numerics in fp32. Torch only: no Triton import here.
"""

from kernels.reference.kv_cache import store_kv_ref
from kernels.reference.paged_attention import paged_attention_ref
from kernels.reference.rms_norm import rms_norm_ref
from kernels.reference.rotary import apply_rotary_ref, build_cos_sin_cache
from kernels.reference.sampling import sample_ref
from kernels.reference.swiglu import silu_and_mul_ref

__all__ = [
    "apply_rotary_ref",
    "build_cos_sin_cache",
    "paged_attention_ref",
    "rms_norm_ref",
    "sample_ref",
    "silu_and_mul_ref",
    "store_kv_ref",
]
