"""What Triton's JIT would compile for a launch on a GPU we do not have, the compile, and its resources.

``spec_for`` binds a Launch's arguments with the JIT's own binder (``JITFunction.run`` does the same
before compiling): which integers are specialised (== 1 becomes a constant, multiples of 16 get a
divisibility hint), which pointers are 16-byte aligned (meta tensors report their view offsets as
pointers), the dtypes, the constexprs and the options. Its ``key`` is the hash ``triton.compile``
files the result under: the kernel's source and every @jit function and global it reads, the
signature, constexprs and options, the target, the Triton and ptxas versions and Triton's
environment variables. Any change that can change the cubin changes the key.

``compile_spec`` compiles with Triton's cache bypassed and reads ptxas's own report (``-v``, which
Triton already passes): registers per thread, stack frame and spill bytes; shared memory comes
from Triton's metadata (it allocates it dynamically).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import re
import time
import warnings
from dataclasses import asdict, dataclass

ARCHS = {"sm_90": 90, "sm_80": 80}


@dataclass(frozen=True)
class Spec:
    """One compile: picklable, so a worker process can rebuild the ASTSource."""

    module: str  # where the kernel lives, e.g. "kernels.paged_attention"
    kernel: str  # its name in that module
    arch: str  # "sm_90" | "sm_80"
    signature: dict  # argument name -> "*bf16" | "i32" | "fp32" | "constexpr" ...
    constexprs: dict  # (index,) -> value
    attrs: dict  # (index,) -> [["tt.divisibility", 16]]
    options: dict  # num_warps, num_stages, ... (CUDAOptions fields)
    key: str  # triton.compile's cache hash

    @property
    def num_warps(self) -> int:
        return self.options["num_warps"]

    @property
    def num_stages(self) -> int:
        return self.options["num_stages"]


@dataclass(frozen=True)
class Resources:
    """What ptxas and Triton report for one compiled kernel (or why it did not compile)."""

    regs: int = 0  # registers per thread
    spill_stores: int = 0  # bytes per thread
    spill_loads: int = 0
    stack: int = 0  # stack frame bytes per thread (local memory; spills live there)
    smem: int = 0  # dynamic shared memory per block, bytes
    error: str = ""  # non-empty: the compile failed

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v or k == "regs"}

    @staticmethod
    def from_json(data: dict) -> Resources:
        return Resources(**data)


def gpu_target(arch: str):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", ARCHS[arch], 32)


def spec_for(launch, arch: str) -> Spec:
    """The compile JITFunction.run would do for ``launch`` on ``arch`` (Triton 3.9 internals)."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.cache import get_cache_key

    kernel = launch.kernel
    backend = make_backend(gpu_target(arch))
    binder = _binder(kernel, backend)
    kwargs = dict(launch.meta, num_warps=launch.num_warps, num_stages=launch.num_stages,
                  debug=kernel.debug or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode,
                  fpsan_homomorphic_casts=knobs.compilation.fpsan_homomorphic_casts)
    bound, specialization, options = binder(*launch.args, **kwargs)
    # What JITFunction.run keys its in-memory cache on: equal keys compile the same kernel.
    memo_key = (id(kernel), arch, tuple(specialization), tuple(sorted(kwargs.items())))
    if memo_key in _SPECS:
        return _SPECS[memo_key]
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    src = ASTSource(kernel, signature, constexprs, attrs)
    key = hashlib.sha256(get_cache_key(src, backend, options, get_cache_invalidating_env_vars()).encode()).hexdigest()
    spec = Spec(kernel.fn.__module__, kernel.fn.__name__, arch, signature, constexprs, attrs, dict(options.__dict__), key)
    _SPECS[memo_key] = spec
    return spec


_BINDERS: dict = {}
_SPECS: dict = {}


def _binder(kernel, backend):
    from triton.runtime.jit import create_function_from_signature

    key = (id(kernel), backend.target.arch)
    if key not in _BINDERS:
        _BINDERS[key] = create_function_from_signature(kernel.signature, kernel.params, backend)
    return _BINDERS[key]


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_spec(spec: Spec) -> tuple[Resources, float, str]:
    """Compile for real (Triton's cache bypassed) -> (resources, seconds, the hash Triton used)."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(spec.module), spec.kernel)
    src = ASTSource(kernel, spec.signature, spec.constexprs, spec.attrs)
    log = io.StringIO()
    start = time.perf_counter()
    try:
        with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            knobs.compilation.always_compile = True  # a fresh compile, so ptxas runs and reports
            knobs.nvidia.dump_ptxas_log = True  # Triton prints ptxas -v's report to stdout
            compiled = triton.compile(src, target=gpu_target(spec.arch), options=spec.options)
    except Exception as e:  # noqa: BLE001 - any compiler failure is the gate's finding
        return Resources(error=describe(e)), time.perf_counter() - start, ""
    seconds = time.perf_counter() - start
    report = log.getvalue()
    regs = _PTXAS_REGS.search(report)
    spills = _PTXAS_SPILLS.search(report)
    if regs is None or spills is None:
        return Resources(error=f"no ptxas report in the compile output: {report[-300:]!r}"), seconds, compiled.hash
    stack, stores, loads = (int(x) for x in spills.groups())
    return Resources(int(regs.group(1)), stores, loads, stack, compiled.metadata.shared), seconds, compiled.hash


def describe(error: BaseException) -> str:
    """One line: where (Triton's "at line:col") and the innermost cause's message."""
    where = next((line for line in str(error).splitlines() if line.startswith("at ")), "")
    inner = error
    while inner.__cause__ is not None or (inner.__context__ is not None and not inner.__suppress_context__):
        inner = inner.__cause__ or inner.__context__
    message = str(inner).strip().splitlines()
    text = message[-1] if message else type(inner).__name__
    return f"{type(error).__name__} {where} {type(inner).__name__}: {text}"[:400]
