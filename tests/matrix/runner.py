"""Runs a batch of matrix cases against the stack, a few at a time, and checks what only the whole
batch shows: no stack process exited or restarted, the generation process is the one that
started, the engine ended no request as an internal error, and KV is back to idle afterwards.

Requests run `CONCURRENCY` at a time, so rows with different parameters share engine steps (the
trial's crash was one row's logprobs in a batch). The stack's children are watched by
services/stack/supervisor.py's Supervisor, as `make run` does: a child that exits is a failure
of the batch (its log tail is in the report), and is restarted so that the rest of the batch
still runs and every distinct failure is listed, not only the first; after `MAX_RESTARTS` the
remaining cases are counted as not run.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from services.stack.supervisor import RestartPolicy, Supervisor
from tests.matrix import checks
from tests.matrix.exchange import Case, exchange
from tests.matrix.ledger import Ledger
from tests.reliability import probe

CONCURRENCY = 4
MAX_RESTARTS = 3
RECOVERY_S = 240.0
# Requests the engine ended with a server-side status (a fault inside the engine, not the client's).
_ENGINE_ERRORS = re.compile(r'mstar_generation_requests_finished_total\{[^}]*status="(INTERNAL|UNKNOWN|DATA_LOSS)"'
                            r'[^}]*\}\s+([0-9.e+]+)')


@dataclass
class Matrix:
    """The session's stack (tests/reliability/conftest.py's Rig), its supervisor and the ledger."""

    rig: object  # tests.reliability.conftest.Rig
    context: dict[str, str]
    ledger: Ledger

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.rig.stack, RestartPolicy(initial_backoff_s=0.2), report=lambda _: None)
        self.first_pid = self.rig.child("generation").pid

    def run(self, cases: Sequence[Case]) -> Ledger:
        batch = Ledger()
        start = time.monotonic()
        engine_errors = self._engine_errors()
        exits_before = len(self._exits())
        try:
            self.rig.run(self._run(cases, batch), timeout_s=3600)
            self.supervisor.poll()
            exits = self._exits()[exits_before:]
            batch.restarts += [e.message for e in exits]
            if not exits:  # a restarted process starts its counters again
                batch.engine_errors += round(self._engine_errors() - engine_errors)
                if self.rig.child("generation").pid != self.first_pid:
                    batch.stack_problems.append("the generation process is not the one the stack started")
            self.first_pid = self.rig.child("generation").pid
            try:  # KV back to the idle baseline, nothing running or waiting, a canary served
                self.rig.check_recovered(timeout_s=60.0)
            except Exception as exc:  # noqa: BLE001 - an AssertionError, or the engine refusing (FAILED)
                detail = exc.details() if hasattr(exc, "details") else str(exc)  # a grpc error: its details
                batch.stack_problems.append(f"not back to idle: {type(exc).__name__}: {str(detail)[:300]}")
        finally:
            batch.seconds = time.monotonic() - start
            self.ledger.merge(batch)
        return batch

    async def _settle(self, exit_window_s: float = 5.0) -> None:
        """After a 5xx: give a failed engine the moment it takes to exit (--failed-exit-s, 2 s),
        then wait until the stack serves again (the supervisor restarts what exited)."""
        seen = len(self._exits())
        deadline = time.monotonic() + exit_window_s
        while time.monotonic() < deadline and len(self._exits()) == seen:
            self.supervisor.poll()
            await asyncio.sleep(0.25)
        await self._recover()

    def _exits(self) -> list:
        return [e for e in self.supervisor.events if e.what == "exited"]

    def _engine_errors(self) -> float:
        try:
            text = httpx.get(self.rig.stack.metrics_urls["generation"], timeout=10).text
        except httpx.HTTPError:
            return 0.0
        return sum(float(value) for _, value in _ENGINE_ERRORS.findall(text))

    async def _run(self, cases: Sequence[Case], batch: Ledger) -> None:
        healthy = asyncio.Event()
        healthy.set()
        suspect = asyncio.Event()  # a 5xx came back: the engine may have failed
        gave_up = asyncio.Event()
        in_flight: set[int] = set()
        stop = asyncio.Event()

        async def watch() -> None:
            seen = len(self._exits())
            while not stop.is_set():
                self.supervisor.poll()
                if suspect.is_set() or len(self._exits()) > seen:
                    healthy.clear()  # hold new requests: they would only meet the failed engine
                    sending = [cases[i] for i in sorted(in_flight)]
                    await self._settle()
                    exits = self._exits()
                    for event in exits[seen:]:
                        event.message = _exit_report(event.message, self.rig.child("generation").log_path, sending)
                    seen = len(exits)
                    if seen > MAX_RESTARTS:
                        gave_up.set()
                    suspect.clear()
                    healthy.set()
                await asyncio.sleep(0.25)

        async with httpx.AsyncClient(base_url=self.rig.http) as client:
            limit = asyncio.Semaphore(CONCURRENCY)

            async def one(index: int, case: Case) -> None:
                async with limit:
                    await healthy.wait()
                    if gave_up.is_set():
                        batch.not_run += 1
                        return
                    in_flight.add(index)
                    try:
                        outcome = await exchange(client, case)
                    finally:
                        in_flight.discard(index)
                    if outcome.status >= 500 or "engine failed" in outcome.text:
                        healthy.clear()  # at once: a refusal takes a millisecond, the watcher 0.25 s
                        suspect.set()
                    problems = checks.violations(case, outcome)
                    rule = (checks.refusal_rule(case, outcome)
                            if case.expect is None and 400 <= outcome.status < 500 else None)
                    batch.record(case, outcome, problems, rule)

            watcher = asyncio.ensure_future(watch())
            try:
                await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
            finally:
                stop.set()
                await watcher

    async def _recover(self) -> None:
        """Keep polling the supervisor (it restarts the child) until a request is served again."""
        deadline = time.monotonic() + RECOVERY_S
        while time.monotonic() < deadline:
            self.supervisor.poll()
            try:
                await probe.canary(self.rig.grpc, timeout_s=10)
                return
            except Exception:  # noqa: BLE001 - not back yet (UNAVAILABLE, refused, deadline)
                await asyncio.sleep(0.5)


def _exit_report(message: str, log_path, in_flight: Sequence[Case]) -> str:
    """The supervisor's line about an exit, the last traceback in the generation log (where the
    engine failed), and what was being sent at that moment."""
    first = message.splitlines()[0]
    try:
        logged = [json.loads(line) for line in log_path.read_text(errors="replace").splitlines()[-400:]
                  if line.startswith("{") and '"exc"' in line]
    except (OSError, ValueError):
        logged = []
    # The engine's own failure, else the last traceback of any kind.
    failure = next((r for r in reversed(logged) if r.get("logger") == "services.generation.engine"),
                   logged[-1] if logged else None)
    where = "\n    ".join(failure["exc"].strip().splitlines()[-4:]) if failure else "(none logged)"
    sending = "\n    ".join(f"{c.surface} {json.dumps(c.body)[:240]}" for c in in_flight)
    return f"{first}\n  last traceback:\n    {where}\n  in flight when the 5xx came back:\n    {sending}"
