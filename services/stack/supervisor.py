"""Keep the stack's children running: a child that exits is started again, with backoff.

    supervisor = Supervisor(stack, report=print)
    while True:
        supervisor.poll()       # `make run` calls this every 0.25 s
        time.sleep(0.25)

A child that exits for any reason while the stack runs (a crash, kill -9, a generation process
whose engine failed and exited with status 3) is restarted with the same command line, ports and
environment, after a delay that doubles with each consecutive exit (0.5 s, 1 s, 2 s ... capped at
30 s, like Kubernetes' CrashLoopBackOff) and resets once the child has stayed up `stable_s`.
Preprocess reconnects to a restarted generation by itself and Envoy's health check re-admits a
restarted preprocess, so a restart heals the stack without touching the other two. Every event is
handed to `report` (the launcher prints it) and kept in `events` (tests read it).

Call `poll` from the thread that lives as long as the stack (make run: the main thread): a child
gets PR_SET_PDEATHSIG (services/stack/process.py), which the kernel ties to the *thread* that
started it, so a child restarted from a short-lived thread would be killed when that thread ends.

Deliberately not restarted: a child that is alive but NOT_SERVING (a generation waiting for its
model, a preprocess waiting for its backend); a failed engine exits by itself so it is restarted.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    stable_s: float = 60.0  # up this long: the next exit starts from initial_backoff_s again


@dataclass
class _Watch:
    started: float
    backoff: float
    restart_due: float | None = None
    restarts: int = 0
    announced_ready: bool = True  # the first start's readiness is the stack's own business


@dataclass
class Event:
    at: float
    child: str
    what: str  # "exited", "restarted", "ready"
    message: str


@dataclass
class Supervisor:
    stack: object  # services.stack.Stack (children, restart(name), ready_check(name))
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    report: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        now = self.clock()
        self._watch = {name: _Watch(now, self.policy.initial_backoff_s) for name in self.stack.children}

    def poll(self) -> None:
        now = self.clock()
        for name, child in list(self.stack.children.items()):
            w = self._watch.setdefault(name, _Watch(now, self.policy.initial_backoff_s))
            if child.alive():
                self._check_alive(name, w, now)
            elif w.restart_due is None:
                self._on_exit(name, child, w, now)
            elif now >= w.restart_due:
                self._restart(name, w, now)

    def _on_exit(self, name: str, child, w: _Watch, now: float) -> None:
        uptime = now - w.started
        if uptime >= self.policy.stable_s:
            w.backoff = self.policy.initial_backoff_s
        delay = w.backoff
        w.backoff = min(w.backoff * 2, self.policy.max_backoff_s)
        w.restart_due = now + delay
        self._emit(now, name, "exited", f"{name} {describe_exit(child.proc.returncode)} after {uptime:.1f} s; "
                   f"restarting in {delay:.1f} s (restart {w.restarts + 1})\n{child.log_tail(8)}")

    def _restart(self, name: str, w: _Watch, now: float) -> None:
        child = self.stack.restart(name)
        w.restart_due, w.started, w.announced_ready = None, now, False
        w.restarts += 1
        self._emit(now, name, "restarted", f"{name} restarted (pid {child.pid}, log {child.log_path})")

    def _check_alive(self, name: str, w: _Watch, now: float) -> None:
        if w.announced_ready:
            return
        try:
            ready = self.stack.ready_check(name)()
        except Exception:  # noqa: BLE001 - not ready yet
            ready = False
        if ready:
            w.announced_ready = True
            self._emit(now, name, "ready", f"{name} is serving again, {now - w.started:.1f} s after its restart")

    def _emit(self, now: float, name: str, what: str, message: str) -> None:
        self.events.append(Event(now, name, what, message))
        self.report(message)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}" + (" (its engine failed)" if code == 3 else "")

