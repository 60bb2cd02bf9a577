"""The one serving state of a process: STARTING -> SERVING -> DRAINING, or FAILED from anywhere.

Health (grpc.health.v1), the servicers (refuse new work), the engine (admit, step) and the metrics
all read this one object instead of keeping flags of their own, so they can never disagree (a
draining server whose backend reconnects must not report SERVING again; an engine that failed
must not admit the next request while health still says SERVING).

    state = ServingState("generation")
    state.serve()                      # loaded and warm: SERVING
    state.fail("ENGINE_FAILED", "...") # latched: the process is not trusted again
    state.drain()                      # SIGTERM: finish what runs, refuse new work
    state.set_dependency("generation", up=False, why="...")   # preprocess: its backend is down
    if (err := state.refusal()) is not None: raise err        # servicers, before new work

Transitions are one-way: STARTING -> SERVING -> DRAINING; any -> FAILED (latched). A transition
that is not allowed (drain after FAILED, serve after DRAINING) is ignored. A process is *ready*
(health SERVING) when it is SERVING and every dependency is up. It is *live* (the `liveness`
health name, for Kubernetes liveness probes) unless FAILED: a process that is merely waiting for a
dependency must not be restarted for it.

Thread-safe: the engine thread and the watchdog thread call `fail`; listeners run on the thread
that made the change (GrpcServer forwards them to its event loop).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable

from services.common.errors import MstarError, unavailable

log = logging.getLogger(__name__)

LIVENESS = "liveness"  # grpc.health.v1 service name: NOT_SERVING only when FAILED


class State(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    FAILED = "failed"


_ALLOWED = {
    State.STARTING: {State.SERVING, State.DRAINING, State.FAILED},
    State.SERVING: {State.DRAINING, State.FAILED},
    State.DRAINING: {State.FAILED},
    State.FAILED: set(),
}


class ServingState:
    def __init__(self, service: str) -> None:
        self.service = service
        self._lock = threading.Lock()
        self._state = State.STARTING
        self._reason = "STARTING"
        self._message = f"the {service} service is starting"
        self._down: dict[str, tuple[str, str]] = {}  # dependency -> (reason, message) while down
        self._listeners: list[Callable[[ServingState], None]] = []

    # ---- reads (any thread)

    @property
    def state(self) -> State:
        return self._state

    @property
    def is_ready(self) -> bool:
        """Health SERVING: serving, and every dependency up."""
        return self._state is State.SERVING and not self._down

    @property
    def is_live(self) -> bool:
        return self._state is not State.FAILED

    @property
    def accepts_work(self) -> bool:
        """For the engine: STARTING admits the warm-up request; DRAINING and FAILED admit nothing."""
        return self._state in (State.STARTING, State.SERVING)

    def refusal(self) -> MstarError | None:
        """The UNAVAILABLE a new request gets now, or None when it may start."""
        with self._lock:
            if self._state is not State.SERVING:
                return unavailable(self._message, reason=self._reason, retry_after_s=None if
                                   self._state is State.FAILED else 1.0)
            if self._down:
                reason, message = next(iter(self._down.values()))
                return unavailable(message, reason=reason)
        return None

    def describe(self) -> dict[str, object]:
        with self._lock:
            return {"state": self._state.value, "reason": self._reason,
                    "dependencies_down": {k: r for k, (r, _) in self._down.items()}}

    # ---- changes

    def serve(self) -> bool:
        return self._move(State.SERVING, "SERVING", f"the {self.service} service is serving")

    def drain(self) -> bool:
        return self._move(State.DRAINING, "DRAINING", f"the {self.service} service is shutting down")

    def fail(self, reason: str, message: str) -> bool:
        """Latched: a FAILED process is not trusted again (it exits or is restarted)."""
        return self._move(State.FAILED, reason, message)

    def set_dependency(self, name: str, up: bool, reason: str = "BACKEND_UNAVAILABLE", message: str = "") -> None:
        with self._lock:
            was_down = name in self._down
            if up == (not was_down):
                return
            if up:
                del self._down[name]
            else:
                self._down[name] = (reason, message or f"{name} is unavailable")
        log.info("dependency", extra={"service": self.service, "dependency": name, "up": up, "reason": reason})
        self._notify()

    def on_change(self, listener: Callable[[ServingState], None]) -> None:
        """Call `listener(self)` after every change (and once now)."""
        self._listeners.append(listener)
        listener(self)

    def _move(self, to: State, reason: str, message: str) -> bool:
        with self._lock:
            if to not in _ALLOWED[self._state]:
                return False
            previous, self._state, self._reason, self._message = self._state, to, reason, message
        log.log(logging.ERROR if to is State.FAILED else logging.INFO, "serving state",
                extra={"service": self.service, "from": previous.value, "to": to.value, "reason": reason})
        self._notify()
        return True

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:  # a broken listener must not stop the others (health, metrics)
                log.exception("serving-state listener failed")
