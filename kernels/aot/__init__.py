"""Ahead-of-time compile gate: every Triton launch the engine can make, compiled for Hopper and Ampere.

No GPU is needed: Triton compiles to PTX and a cubin with its bundled ``ptxas``. The pieces:

    matrix.py   which launches: the model's KernelOps calls (kernel_calls.json, written by
                services/generation/kernel_calls.py from its forward on ``meta`` tensors, per
                supported model, dtype, page size and step shape) replayed through the launchers'
                own ``plan_*`` functions per GPU; kernels/ imports nothing from services
    build.py    what Triton's JIT would compile for a launch on sm_90 / sm_80 (its own binder), the
                compile itself, and the resources ptxas reports (registers, spills, shared memory)
    limits.py   the GPUs' limits and the occupancy each kernel needs, hence the register bound
    ledger.py   results by compile hash (ledger.json), so unchanged kernels are not recompiled
    gate.py     the check; ``python -m kernels.aot`` runs it (``make test`` does, through pytest)
"""
