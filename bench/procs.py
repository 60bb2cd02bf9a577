"""Start and stop the processes under test; wait until they answer."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "bench" / "out" / "logs"
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_setup() -> None:
    # Own session (stop() signals the group and nothing else) and SIGKILL when the bench dies,
    # so an interrupted run never leaves a server holding a port and two cores.
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def spawn(name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
    """Start a process with its output in bench/out/logs/<name>.log."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = open(LOG_DIR / f"{name}.log", "wb")  # noqa: SIM115 (lives as long as the process)
    return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            preexec_fn=_child_setup)


def python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def read_port_line(proc: subprocess.Popen, log_name: str, timeout: float = 30.0) -> int:
    """For children that print 'PORT <n>' (the bare server)."""
    deadline = time.monotonic() + timeout
    path = LOG_DIR / f"{log_name}.log"
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("PORT "):
                    return int(line.split()[1])
        if proc.poll() is not None:
            raise RuntimeError(f"{log_name} exited with {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError(f"{log_name} printed no port")
