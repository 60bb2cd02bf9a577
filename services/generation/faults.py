"""Fault injection for the reliability suite: off unless configured, then a wrapper around the runner.

Configuration comes from the environment so tests can inject faults into the real generation
process without a code path that exists in production:

    MSTAR_FAULTS="forward_raise_at_step=5,stall_step_at=3:30,nan_row_at_step=4:1,arm_file=/tmp/x"

- ``forward_raise_at_step=N``   the N-th model forward raises ``InjectedFault`` (R06).
- ``stall_step_at=N:SECONDS``   the N-th forward sleeps SECONDS before computing (R08, watchdog).
- ``nan_row_at_step=N[:ROW]``   the first forward >= N that samples returns NaN logits in row ROW
                                (default 0; clamped to the batch) (R30).
- ``request_fault_at_step=N:STAGE``  from the N-th forward on, the first request whose per-request
                                work reaches STAGE (sample, grammar, token, pool, finish: the engine's
                                fault boundary; output: the servicer's) raises there, and keeps
                                raising there (the boundary retries a batch row by row) (issue 28).
- ``arm_file=PATH``             forwards are counted only once PATH exists, so a test can start
                                the stack, let warm-up traffic pass, then arm the fault.

Steps count model forwards from 1 (after arming). Each fault fires once. When MSTAR_FAULTS is
absent or empty, ``install_from_env`` returns the runner untouched: no wrapper, no check per step.

Where it hooks: a real ModelRunner has ``forward`` (one step's logits [S, V], one row per sampling
sequence, from a compiled decode graph or the eager model), which is wrapped so the sampler's own
non-finite detection is exercised. A runner without it (the null engine) has ``run`` wrapped
instead, and the NaN fault marks the row non-finite in its SampleOutput, which is what the sampler
reports for a NaN row.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV_VAR = "MSTAR_FAULTS"


class InjectedFault(RuntimeError):
    """Raised by an armed forward_raise_at_step fault; the engine treats it like any crash."""


@dataclass(frozen=True)
class FaultConfig:
    forward_raise_at_step: int | None = None
    stall_step_at: int | None = None
    stall_seconds: float = 0.0
    nan_row_at_step: int | None = None
    nan_row: int = 0
    arm_file: str | None = None
    request_fault_at_step: int | None = None
    request_fault_stage: str = ""

    @property
    def is_empty(self) -> bool:
        return (self.forward_raise_at_step is None and self.stall_step_at is None and self.nan_row_at_step is None
                and self.request_fault_at_step is None)


STAGES = ("sample", "grammar", "token", "pool", "finish", "output")  # services/generation/postprocess.py


def _positive_int(key: str, text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{ENV_VAR}: {key} must be >= 1, got {value}")
    return value


def parse_faults(spec: str) -> FaultConfig:
    """Parse the MSTAR_FAULTS grammar; unknown keys and bad values raise ValueError (a typo in a
    fault spec must not silently turn a fault test into a no-fault test)."""
    fields: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"{ENV_VAR}: expected key=value, got {item!r}")
        if key == "forward_raise_at_step":
            fields["forward_raise_at_step"] = _positive_int(key, value)
        elif key == "stall_step_at":
            step, _, seconds = value.partition(":")
            fields["stall_step_at"] = _positive_int(key, step)
            fields["stall_seconds"] = float(seconds) if seconds else 60.0
            if not 0.0 < float(fields["stall_seconds"]) <= 3600.0:  # bounded: nothing hangs forever
                raise ValueError(f"{ENV_VAR}: stall seconds must be in (0, 3600], got {seconds}")
        elif key == "nan_row_at_step":
            step, _, row = value.partition(":")
            fields["nan_row_at_step"] = _positive_int(key, step)
            fields["nan_row"] = int(row) if row else 0
            if int(fields["nan_row"]) < 0:
                raise ValueError(f"{ENV_VAR}: nan row must be >= 0, got {row}")
        elif key == "request_fault_at_step":
            step, _, stage = value.partition(":")
            fields["request_fault_at_step"] = _positive_int(key, step)
            if stage not in STAGES:
                raise ValueError(f"{ENV_VAR}: request fault stage must be one of {', '.join(STAGES)}, got {stage!r}")
            fields["request_fault_stage"] = stage
        elif key == "arm_file":
            fields["arm_file"] = value
        else:
            raise ValueError(f"{ENV_VAR}: unknown fault {key!r}")
    return FaultConfig(**fields)  # type: ignore[arg-type]


def faults_from_env(env: Mapping[str, str] | None = None) -> FaultConfig | None:
    spec = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    if not spec:
        return None
    config = parse_faults(spec)
    return None if config.is_empty else config


class FaultInjector:
    """Counts forwards and fires each configured fault once. Only the engine loop thread calls
    ``next_step``; the lock only guards tests that drive it from several threads."""

    def __init__(self, config: FaultConfig):
        self.config = config
        self.num_steps = 0
        self.fired: list[str] = []
        self.faulty_request = None  # the key request_fault_at_step picked
        self._lock = threading.Lock()

    def _armed(self) -> bool:
        return self.config.arm_file is None or os.path.exists(self.config.arm_file)

    def next_step(self) -> int:
        """Count one forward (0 while unarmed) and apply raise/stall faults due at this step."""
        if not self._armed():
            return 0
        with self._lock:
            self.num_steps += 1
            step = self.num_steps
        c = self.config
        if c.stall_step_at == step:
            self.fired.append("stall")
            log.warning("fault: stalling step", extra={"step": step, "seconds": c.stall_seconds})
            time.sleep(c.stall_seconds)
        if c.forward_raise_at_step == step:
            self.fired.append("raise")
            log.warning("fault: raising in forward", extra={"step": step})
            raise InjectedFault(f"injected fault: model forward raised at step {step}")
        return step

    def nan_row_now(self, step: int, num_rows: int) -> int | None:
        """The row to poison at this step, or None. Fires at the first step >= N that samples at
        least one row (a prefill-only step has none), clamped so a short batch still gets it."""
        due = self.config.nan_row_at_step
        if step == 0 or due is None or step < due or num_rows == 0 or "nan" in self.fired:
            return None
        self.fired.append("nan")
        row = min(self.config.nan_row, num_rows - 1)
        log.warning("fault: NaN logits", extra={"step": step, "row": row})
        return row


    def request_fault(self, stage: str, key) -> None:
        """The fault boundaries' hook (FaultBoundary.inject): raise in the chosen request's work."""
        c = self.config
        if stage != c.request_fault_stage or c.request_fault_at_step is None:
            return
        with self._lock:
            if self.faulty_request is None:
                if self.num_steps < c.request_fault_at_step:
                    return
                self.faulty_request = key
                self.fired.append("request")
                log.warning("fault: raising in one request's work", extra={"stage": stage, "request_key": str(key)})
        if key == self.faulty_request:
            raise InjectedFault(f"injected fault: {stage} raised for request {key!r}")


def install(runner, config: FaultConfig) -> FaultInjector:
    """Wrap runner.forward (real model) or runner.run (null runner) with the faults."""
    injector = FaultInjector(config)
    if callable(getattr(runner, "forward", None)):
        forward = runner.forward

        def faulty_forward(*args, **kwargs):
            step = injector.next_step()
            logits = forward(*args, **kwargs)  # [S, V], one row per sampling sequence
            row = injector.nan_row_now(step, logits.shape[0])
            if row is not None:
                logits = logits.clone()
                logits[row] = float("nan")
            return logits

        runner.forward = faulty_forward
    else:
        run = runner.run

        def faulty_run(*args, **kwargs):
            step = injector.next_step()
            rows = run(*args, **kwargs)  # NullRows: one is_finite flag per sampling sequence
            row = injector.nan_row_now(step, len(rows.is_finite))
            if row is not None:
                rows.is_finite[row] = False
            return rows

        runner.run = faulty_run
    log.warning("fault injection enabled", extra={"faults": repr(config)})
    return injector


def install_from_env(runner, env: Mapping[str, str] | None = None):
    """The one call the generation service makes: returns the runner, wrapped only when
    MSTAR_FAULTS is set. A malformed spec raises at startup."""
    config = faults_from_env(env)
    if config is not None:
        runner.fault_injector = install(runner, config)
    return runner


def attach_boundaries(runner, *boundaries) -> None:
    """Give the fault boundaries (engine, servicer) the injector's request-fault hook, if any."""
    injector = getattr(runner, "fault_injector", None)
    if injector is not None and injector.config.request_fault_at_step is not None:
        for boundary in boundaries:
            boundary.inject = injector.request_fault
