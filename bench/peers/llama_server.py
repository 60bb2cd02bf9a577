"""Peer 2: llama.cpp's own C++ `llama-server` (continuous batching over parallel slots), loading
the very same GGUF file, driven through its OpenAI-compatible /v1/completions by the same load
generator and the same OpenAISSEClient as mstar-through-Envoy. Never llama-cpp-python's server.

The binary is built once by bench/peers/build_llama_server.sh (`make bench-peers`) and cached in
~/.cache/mstar/llama.cpp; without it the peer is reported as not built.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench import procs

CACHE = Path(os.environ.get("MSTAR_CACHE", Path.home() / ".cache" / "mstar")) / "llama.cpp"
BINARY = CACHE / "build" / "bin" / "llama-server"


def available() -> bool:
    return BINARY.is_file() and os.access(BINARY, os.X_OK)


def version() -> str:
    try:
        out = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True, timeout=20)
        return (out.stdout + out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown"


class LlamaServer:
    """`with LlamaServer(gguf, threads=2, slots=16) as s:` then s.base_url, s.pid."""

    def __init__(self, gguf: str, threads: int = 2, slots: int = 16, ctx_per_slot: int = 512) -> None:
        self.port = procs.free_port()
        # -c is the total context, split evenly across the -np slots.
        self.argv = [str(BINARY), "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
                     "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(slots * ctx_per_slot),
                     "-cb", "--no-webui", "-a", "default"]
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None  # launch until /health answers 200 (model loaded, slots up)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> LlamaServer:
        t0 = time.monotonic()
        self.proc = procs.spawn("llama-server", self.argv)
        procs.wait_http(self.base_url + "/health", self.proc, timeout=120)
        self.startup_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc) -> None:
        procs.stop(self.proc)
