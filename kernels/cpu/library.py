"""Build and load the CPU serving ops (``csrc/*.cpp``) as ``torch.ops.mstar_cpu.*``.

The library is compiled on the machine that runs it, for that machine (``-march=native``: the
quantized matmul picks AVX512-VNNI, AVX2 or plain C++ at compile time), with the system C++
compiler against the installed torch's headers. The result is cached under
``$MSTAR_KERNEL_CACHE`` (default ``~/.cache/mstar/kernels``) in a directory named by a hash of the
sources, torch version, compiler, flags and CPU flags, so a restart is a dlopen and two checkouts
or machines never share a stale binary. A first build takes ~25 s on a 2-core box (the source
files compile in parallel); concurrent processes building the same key wait on a file lock.

    load()        -> None, or raises KernelBuildError with the compiler's message
    load_error()  -> None when the ops are loaded, else why they could not be (cached)
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).parent / "csrc").glob("*.cpp"))
HEADERS = sorted((Path(__file__).parent / "csrc").glob("*.h"))  # part of the cache key, not compiled alone
LIBRARY_NAME = "mstar_cpu"
CACHE_ENV = "MSTAR_KERNEL_CACHE"
_CXX_FLAGS = ["-O3", "-march=native", "-std=c++20", "-fPIC", "-fopenmp", "-DNDEBUG", "-w",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]


class KernelBuildError(RuntimeError):
    """The CPU ops could not be compiled or loaded here (no compiler, unsupported platform, ...)."""


_state: dict[str, object] = {}  # "loaded": True, or "error": KernelBuildError


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise KernelBuildError("no C++ compiler found (set CXX or install g++)")
    return cxx


def _key(cxx: str) -> str:
    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        h.update(path.name.encode() + path.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    for part in (torch.__version__, version, " ".join(_CXX_FLAGS + _python_flags()), _cpu_flags(), sys.platform):
        h.update(part.encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mstar" / "kernels")


def _python_flags() -> list[str]:
    """Python's headers, when installed: the long ops let the GIL go while they run (gil.h)."""
    include = sysconfig.get_paths()["include"]
    return [f"-I{include}", "-DMSTAR_RELEASE_GIL"] if (Path(include) / "Python.h").exists() else []


def _build(cxx: str, target: Path) -> None:
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in include_paths("cpu")] + _python_flags()
    torch_lib = Path(torch.__file__).parent / "lib"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{src.stem}.o" for src in SOURCES]
        jobs = [subprocess.Popen([cxx, *_CXX_FLAGS, *includes, "-c", str(src), "-o", str(obj)],
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


def load() -> None:
    """Make torch.ops.mstar_cpu.* available in this process (build once per machine and source)."""
    if _state.get("loaded"):
        return
    if "error" in _state:
        raise _state["error"]  # type: ignore[misc]
    try:
        if sys.platform != "linux" or not SOURCES:
            raise KernelBuildError(f"the CPU ops are built on Linux only (this is {sys.platform})")
        cxx = _compiler()
        directory = cache_dir() / _key(cxx)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"lib{LIBRARY_NAME}.so"
        with open(directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per key; the others wait, then load its result
            if not target.exists():
                t0 = time.monotonic()
                _build(cxx, target)
                log.info("built the CPU ops", extra={"path": str(target), "seconds": round(time.monotonic() - t0, 1)})
        torch.ops.load_library(str(target))
    except (KernelBuildError, OSError, RuntimeError) as e:
        error = e if isinstance(e, KernelBuildError) else KernelBuildError(f"{type(e).__name__}: {e}")
        _state["error"] = error
        raise error from e
    _state["loaded"] = True


def load_error() -> KernelBuildError | None:
    """None when the ops load (building them if needed), else the reason they cannot."""
    try:
        load()
    except KernelBuildError as e:
        return e
    return None
