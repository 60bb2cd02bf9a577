"""Stacks for the reliability suite, built on services.stack.Stack (the same launcher as `make run`
and the e2e tests) so faults hit the real processes over the real wire.

- `rig`: one shared, healthy stack (null engine: fast, deterministic, no model weights) for the
  non-destructive cases. Every test using it ends with `rig.check_recovered()`: KV back to the idle
  baseline, nothing running or waiting, and a new request still served.
- `model_rig`: the same with the real default model, for cases whose meaning depends on real
  tokens (text, stop strings, batch invariance).
- `make_rig(...)`: a private stack for destructive cases (kill -9, SIGTERM, injected faults); it is
  torn down by the fixture, however the test ends.

Faults reach the generation process through MSTAR_FAULTS (services/generation/faults.py); an
`arm_file` makes them count forwards only after the stack's own readiness request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.stack import Stack, StackConfig
from tests.reliability import probe

# How many examples the property-based fuzz tests run (`make test-reliability` sets 10000).
FUZZ_EXAMPLES = int(os.environ.get("MSTAR_FUZZ_EXAMPLES", "100"))


NULL_STEP = ("--null-step-ms", "20")
MAX_APPENDS = 256
MAX_INPUT_BYTES = 1024 * 1024
STEP_S = 0.02


class Rig:
    """A started Stack plus the probes the suite needs."""

    def __init__(self, stack: Stack, arm_file: Path | None = None):
        self.stack = stack
        self.arm_file = arm_file
        self.kv_baseline = 0.0
        self.file_root: Path | None = None

    @property
    def http(self) -> str:
        return self.stack.http_url

    @property
    def grpc(self) -> str:  # public API through Envoy (plain gRPC passes through)
        return self.stack.grpc_target

    @property
    def preprocess(self) -> str:
        return self.stack.preprocess_target

    @property
    def generation(self) -> str:
        return self.stack.generation_target

    def child(self, name: str):
        return self.stack.children[name]

    def arm(self) -> None:
        assert self.arm_file is not None, "this rig has no faults to arm"
        self.arm_file.touch()

    def run(self, coro, timeout_s: float = 120.0):
        """Run a coroutine to completion with a hard bound (every test loop stops by itself)."""
        return asyncio.run(asyncio.wait_for(coro, timeout_s))

    def record_baseline(self) -> None:
        status = self.run(probe.wait_engine_idle(self.generation, kv_baseline=1e9, timeout_s=30))
        self.kv_baseline = status.get("kv_blocks_used", 0.0)

    def check_recovered(self, timeout_s: float = 15.0) -> dict[str, float]:
        """The after-every-case check: idle KV baseline, nothing running, and a canary served."""
        status = self.run(probe.wait_engine_idle(self.generation, self.kv_baseline, timeout_s))
        self.run(probe.canary(self.grpc))
        self.run(probe.wait_engine_idle(self.generation, self.kv_baseline, timeout_s))
        for name in ("generation", "preprocess", "envoy"):
            assert self.child(name).alive(), f"{name} died:\n{self.stack.describe_failure()}"
        return status


@contextlib.contextmanager
def started_rig(tmp_dir: Path, *, faults: str = "", null_engine: bool = True,
                generation_args: tuple[str, ...] = (), preprocess_args: tuple[str, ...] = (),
                envoy_overrides: dict | None = None, ready_timeout_s: float = 300.0) -> Iterator[Rig]:
    arm_file = tmp_dir / "arm-faults" if faults else None
    env_faults = f"{faults},arm_file={arm_file}" if faults else ""
    config = StackConfig.with_free_ports(
        null_engine=null_engine, log_dir=tmp_dir / "logs", ready_timeout_s=ready_timeout_s,
        generation_args=list(generation_args), preprocess_args=list(preprocess_args),
        envoy_overrides=dict(envoy_overrides or {}))
    stack = Stack(config)
    # Children inherit os.environ when they are spawned (inside start()); set the fault spec only
    # for that moment so no other stack in this session sees it.
    previous = os.environ.get("MSTAR_FAULTS")
    os.environ["MSTAR_FAULTS"] = env_faults
    try:
        stack.start()
    finally:
        if previous is None:
            os.environ.pop("MSTAR_FAULTS", None)
        else:
            os.environ["MSTAR_FAULTS"] = previous
    try:
        rig = Rig(stack, arm_file)
        rig.record_baseline()
        yield rig
    finally:
        stack.stop(grace_s=5.0)


@pytest.fixture(scope="session")
def rig(tmp_path_factory) -> Iterator[Rig]:
    # 20 ms per null step (~50 tokens/s per request): long generations last long enough to be
    # interrupted at a chosen moment, short ones still finish in a fraction of a second.
    tmp = tmp_path_factory.mktemp("rig")
    files = make_file_root(tmp / "files")
    # Small per-stream input caps (defaults: 4096 appends, 8 MB) so R24 reaches them in a second.
    caps = ("--max-appends", str(MAX_APPENDS), "--max-input-bytes", str(MAX_INPUT_BYTES))
    with started_rig(tmp, generation_args=NULL_STEP, preprocess_args=("--file-root", str(files), *caps)) as r:
        r.file_root = files
        yield r


def make_file_root(root: Path) -> Path:
    """The allow-listed root for file_path inputs, with the traps R25 needs already inside it."""
    root.mkdir(parents=True)
    (root / "ok.txt").write_text("The quick brown fox.")
    (root / "escape").symlink_to("/etc/passwd")  # a symlink inside the root pointing out of it
    (root / "dirlink").symlink_to("/etc")
    os.mkfifo(root / "fifo")  # opening it blocking would hang the reader forever
    with open(root / "huge.bin", "wb") as f:  # 10 GB, sparse: costs no disk
        f.truncate(10 * 1024**3)
    return root


@pytest.fixture(scope="session")
def model_rig(tmp_path_factory) -> Iterator[Rig]:
    with started_rig(tmp_path_factory.mktemp("model-rig"), null_engine=False) as r:
        yield r


@pytest.fixture
def make_rig(tmp_path):
    """Factory for private stacks; all of them are stopped when the test ends."""
    with contextlib.ExitStack() as stack:
        def make(**kwargs) -> Rig:
            n = len(list(tmp_path.glob("rig*")))
            return stack.enter_context(started_rig(tmp_path / f"rig{n}", **kwargs))

        yield make


@pytest.fixture(scope="session")
def figures():
    """Measured figures (seconds) for docs/reliability.md, written to build/reliability-figures.json."""
    import json

    values: dict[str, float] = {}
    yield values
    if values:
        out = Path(__file__).resolve().parents[2] / "build" / "reliability-figures.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**old, **values}, indent=2, sort_keys=True))
