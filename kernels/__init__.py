"""Kernels for the generation hot path.

Importing this package (or ``kernels.dispatch`` / ``kernels.reference``) imports torch only:
Triton is imported lazily by ``KernelOps.create`` when the Triton backend is chosen, so CPU
serving never pays for it. The Triton launchers live in ``kernels.{rms_norm, rotary, swiglu,
kv_cache, paged_attention, sampling}``; their plain-torch references in ``kernels.reference``.
"""
