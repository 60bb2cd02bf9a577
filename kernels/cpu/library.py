"""Build and load the CPU serving ops (``csrc/*.cpp``) as ``torch.ops.mstar_cpu.*``.

The library is compiled on the machine that runs it, with the system C++ compiler against the
installed torch's headers, for one instruction set (``ISAS``): by default ``native``, this machine's
(``-march=native``); ``$MSTAR_KERNEL_ISA`` names another (``scalar``, ``avx2``, ``avx512``,
``avx512_vnni``). The kernels choose their paths at compile time from the ISA macros (quant_matmul:
AVX512-VNNI, AVX2 or plain C++; attention and argmax: 16 or 8 lanes or plain loops), so the ISA
named here is the one decision; tests/kernels/test_cpu_isa.py builds every one on every machine and
runs the op tests on each this CPU can execute. The result is cached under ``$MSTAR_KERNEL_CACHE``
(default ``~/.cache/mstar/kernels``) in a directory named by a hash of the sources, torch version,
compiler, flags and, for ``native``, the CPU's flags, so a restart is a dlopen and two checkouts or
machines never share a stale binary. A first build takes ~25 s on a 2-core box (the source files
compile in parallel); concurrent processes building the same key wait on a file lock.

    load()                        -> None, or raises KernelBuildError with the compiler's message
    load_error()                  -> None when the ops are loaded, else why they could not be (cached)
    build(isa)                    -> the built library's path (compiled once per key, not loaded)
    missing_flags(isa, cpu_flags) -> the CPU flags a build needs that cpu_flags lack (empty: it runs)
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).parent / "csrc").glob("*.cpp"))
HEADERS = sorted((Path(__file__).parent / "csrc").glob("*.h"))  # part of the cache key, not compiled alone
LIBRARY_NAME = "mstar_cpu"
CACHE_ENV = "MSTAR_KERNEL_CACHE"
_CXX_FLAGS = ["-O3", "-std=c++20", "-fPIC", "-fopenmp", "-DNDEBUG", "-w",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]


ISA_ENV = "MSTAR_KERNEL_ISA"
NATIVE = "native"
_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512dq", "avx512vl")
# name -> the CPU features (as /proc/cpuinfo names them) an explicit x86-64 build turns on, and so
# needs to run: exactly those the kernels branch on (instruction_sets() reports the macros), so a CPU
# with them runs the build whatever else it has or lacks. native: -march=native.
ISAS: dict[str, tuple[str, ...] | None] = {
    NATIVE: None,  # everything the compiler finds on this CPU: the default
    "scalar": (),  # the plain C++ paths: any x86-64 CPU
    "avx2": _AVX2,  # Haswell, Zen 1-3
    "avx512": _AVX512,  # Skylake-SP: 16 lanes, but the AVX2 matmul tiles (no VNNI)
    "avx512_vnni": (*_AVX512, "avx512_vnni"),  # Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4
}


def target_flags(isa: str) -> list[str]:
    """The compiler's target flags for an ISA: -march=native, or baseline x86-64 plus each feature
    (gcc and clang name them as /proc/cpuinfo does, less the underscores)."""
    features = ISAS[isa]
    if features is None:
        return ["-march=native"]
    return ["-march=x86-64", *(f"-m{feature.replace('_', '')}" for feature in features)]


class KernelBuildError(RuntimeError):
    """The CPU ops could not be compiled or loaded here (no compiler, unsupported platform, ...)."""


_state: dict[str, object] = {}  # "loaded": the ISA name, or "error": KernelBuildError


def detect_cpu_flags() -> str:
    """This CPU's feature flags as /proc/cpuinfo lists them ("" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""
    return line.partition(":")[2].strip()


def chosen_isa(environ: Mapping[str, str] = os.environ) -> str:
    """The ISA the ops are built for: $MSTAR_KERNEL_ISA, else native."""
    isa = environ.get(ISA_ENV) or NATIVE
    if isa not in ISAS:
        raise KernelBuildError(f"{ISA_ENV} must be one of {', '.join(ISAS)}; got {isa!r}")
    return isa


def missing_flags(isa: str, cpu_flags: str) -> list[str]:
    """The flags a CPU needs to run the `isa` build and cpu_flags lack ([]: it runs there; the
    native build runs on the CPU it was built on)."""
    have = set(cpu_flags.split())
    return [flag for flag in ISAS[isa] or () if flag not in have]


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise KernelBuildError("no C++ compiler found (set CXX or install g++)")
    return cxx


def _flags(isa: str) -> list[str]:
    if isa != NATIVE and platform.machine() not in ("x86_64", "AMD64"):
        raise KernelBuildError(f"the {isa} build is x86-64's; this machine is {platform.machine()} (use native)")
    return [*_CXX_FLAGS, *target_flags(isa)]


def _key(cxx: str, isa: str) -> str:
    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        h.update(path.name.encode() + path.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    cpu = detect_cpu_flags() if isa == NATIVE else ""  # an explicit ISA's binary is the same on every CPU
    for part in (torch.__version__, version, " ".join(_flags(isa) + _python_flags()), cpu, sys.platform):
        h.update(part.encode())
    return h.hexdigest()[:16] + ("" if isa == NATIVE else f"-{isa}")


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mstar" / "kernels")


def _python_flags() -> list[str]:
    """Python's headers, when installed: the long ops let the GIL go while they run (gil.h)."""
    include = sysconfig.get_paths()["include"]
    return [f"-I{include}", "-DMSTAR_RELEASE_GIL"] if (Path(include) / "Python.h").exists() else []


def _compile(cxx: str, flags: list[str], target: Path) -> None:
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in include_paths("cpu")] + _python_flags()
    torch_lib = Path(torch.__file__).parent / "lib"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{src.stem}.o" for src in SOURCES]
        jobs = [subprocess.Popen([cxx, *flags, *includes, "-c", str(src), "-o", str(obj)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for src, obj in zip(SOURCES, objects, strict=True)]
        outputs = [job.communicate()[0] for job in jobs]
        for src, job, out in zip(SOURCES, jobs, outputs, strict=True):
            if job.returncode:
                raise KernelBuildError(f"compiling {src.name} failed:\n{out[-3000:]}")
        link = subprocess.run([cxx, "-shared", "-fopenmp", *map(str, objects), "-o", str(Path(tmp) / target.name),
                               f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"],
                              capture_output=True, text=True)
        if link.returncode:
            raise KernelBuildError(f"linking {target.name} failed:\n{(link.stdout + link.stderr)[-3000:]}")
        os.replace(Path(tmp) / target.name, target)  # atomic: readers never see a partial file


def build(isa: str = NATIVE) -> Path:
    """The library compiled for `isa` (ISAS), built on the first call for its key and cached; not
    loaded, so any ISA builds on any x86-64 machine. Raises KernelBuildError."""
    if sys.platform != "linux" or not SOURCES:
        raise KernelBuildError(f"the CPU ops are built on Linux only (this is {sys.platform})")
    cxx = _compiler()
    directory = cache_dir() / _key(cxx, isa)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"lib{LIBRARY_NAME}.so"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per key; the others wait, then load its result
        if not target.exists():
            t0 = time.monotonic()
            _compile(cxx, _flags(isa), target)
            log.info("built the CPU ops", extra={"path": str(target), "isa": isa,
                                                 "seconds": round(time.monotonic() - t0, 1)})
    return target


def load() -> None:
    """Make torch.ops.mstar_cpu.* available in this process, built for chosen_isa() (once per
    machine and source). An ISA this CPU cannot execute is refused here, not a SIGILL later."""
    if _state.get("loaded"):
        return
    if "error" in _state:
        raise _state["error"]  # type: ignore[misc]
    try:
        isa = chosen_isa()
        missing = missing_flags(isa, detect_cpu_flags())
        if missing:
            raise KernelBuildError(f"{ISA_ENV}={isa} needs CPU flags this CPU lacks: {' '.join(missing)}")
        torch.ops.load_library(str(build(isa)))
    except (KernelBuildError, OSError, RuntimeError) as e:
        error = e if isinstance(e, KernelBuildError) else KernelBuildError(f"{type(e).__name__}: {e}")
        _state["error"] = error
        raise error from e
    _state["loaded"] = isa


def loaded_isa() -> str | None:
    """The ISA of the library this process loaded (None: not loaded)."""
    return _state.get("loaded")  # type: ignore[return-value]


def load_error() -> KernelBuildError | None:
    """None when the ops load (building them if needed), else the reason they cannot."""
    try:
        load()
    except KernelBuildError as e:
        return e
    return None
