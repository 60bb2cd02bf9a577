"""Watchdog: work is pending but the engine makes no step progress for `timeout_s` -> trip once.

The engine loop runs model steps in its own thread; a step that hangs (a stuck kernel, a deadlock,
an injected stall) would otherwise leave every request waiting forever while health still says
SERVING. The watchdog polls two cheap reads from its own thread:

- ``progress()``: a value that changes whenever a step completes (the engine's step counter);
- ``has_work()``: whether any request could be stepped right now.

It trips when ``has_work()`` stayed true and ``progress()`` stayed the same for longer than
``timeout_s``, measured from the later of the last progress and the moment work appeared, so an
engine that was idle for an hour and just got a request is not "stalled". Time in which the
watchdog itself did not run (its poll came more than a few periods late: the whole process was
stopped, e.g. SIGSTOP, or the machine suspended) is not charged to the engine either: the engine
thread was frozen with it and gets a fresh ``timeout_s`` once both run again. Tripping is latched: a
process whose step hung cannot be trusted again (the stuck thread may still hold the device), so
``on_stall(stalled_for_s)`` runs once, from the watchdog thread, and is expected to fail pending
requests with UNAVAILABLE and report NOT_SERVING so the orchestrator restarts it.

The timeout must exceed the longest legitimate step (a full-budget prefill on CPU); see
docs/reliability.md for how it was chosen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

# The longest legitimate step is a full-budget prefill chunk deep into a long prompt: its attention
# reads every earlier token. On the 2-core AVX2 box (default model, idle) a 512-token chunk takes
# 1.0 s at the prompt's start and 10.8 s at 6.6k tokens; a box loaded by other work ran such
# chunks 3x slower, past the 30 s this used to be, and the watchdog then failed every tenant's
# requests for a prompt that was merely long (issue 28). 120 s keeps that margin; a real hang is
# still caught within two minutes.
DEFAULT_TIMEOUT_S = 120.0


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        progress: Callable[[], Hashable],
        has_work: Callable[[], bool],
        on_stall: Callable[[float], None],
        poll_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if timeout_s <= 0:
            raise ValueError(f"watchdog timeout must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.poll_s = poll_s if poll_s is not None else min(1.0, timeout_s / 4)
        self._progress = progress
        self._has_work = has_work
        self._on_stall = on_stall
        self._clock = clock
        self._last_value: Hashable = None
        self._since = clock()  # when progress last changed or work last appeared
        self._last_poll = self._since
        # A poll later than this after the previous one means the watchdog was frozen too.
        self._frozen_gap_s = max(3 * self.poll_s, 1.0)
        self.tripped = False
        self.stalled_for_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """One poll; returns True when it tripped on this call. Public so tests need no thread."""
        if self.tripped:
            return False
        now = self._clock()
        frozen = now - self._last_poll > self._frozen_gap_s
        self._last_poll = now
        if frozen:  # the process did not run (SIGSTOP, suspend): that time is nobody's stall
            self._since = now
            return False
        try:
            value, busy = self._progress(), self._has_work()
        except RuntimeError:
            # Reading the engine's queues while its thread mutates them can raise
            # "mutated during iteration": that thread is evidently alive, so count it as progress.
            self._since = now
            return False
        if value != self._last_value or not busy:
            # Progress, or nothing to do: the clock restarts, so when work appears after a long
            # idle spell it is measured from the last idle poll, not from the last step.
            self._last_value, self._since = value, now
        if busy and now - self._since > self.timeout_s:
            self.tripped = True
            self.stalled_for_s = now - self._since
            log.error("watchdog: no engine progress with work pending",
                      extra={"stalled_for_s": round(self.stalled_for_s, 3), "timeout_s": self.timeout_s})
            self._on_stall(self.stalled_for_s)
            return True
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                if self.check():
                    return
            except Exception:  # the callback failed: log it, the trip is still latched
                log.exception("watchdog: on_stall raised")
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 1.0)


def engine_has_work(engine) -> bool:
    """True when the engine's scheduler could step some request now (read from another thread)."""
    return engine.scheduler.has_work()


def watch_engine(engine, timeout_s: float, on_stall: Callable[[float], None], poll_s: float | None = None):
    """A started watchdog on an Engine: progress is its step counter, work its schedulable requests."""
    dog = Watchdog(timeout_s, lambda: engine.num_steps, lambda: engine_has_work(engine), on_stall, poll_s)
    dog.start()
    return dog
