"""Unit tests of the fault hooks and the watchdog (no processes; milliseconds)."""

from __future__ import annotations

import pytest
import torch

from services.generation import faults
from services.generation.faults import FaultConfig, InjectedFault, install, install_from_env, parse_faults
from services.generation.watchdog import Watchdog

pytestmark = pytest.mark.reliability


def test_parse_full_spec():
    c = parse_faults("forward_raise_at_step=5, stall_step_at=3:2.5,nan_row_at_step=4:1,arm_file=/tmp/a")
    assert c == FaultConfig(5, 3, 2.5, 4, 1, "/tmp/a")


@pytest.mark.parametrize("spec", ["bogus=1", "forward_raise_at_step=0", "stall_step_at=1:0",
                                  "stall_step_at=1:99999", "nan_row_at_step=2:-1", "forward_raise_at_step"])
def test_parse_rejects_typos_and_unbounded_values(spec):
    with pytest.raises(ValueError):
        parse_faults(spec)


def test_absent_or_empty_env_installs_nothing():
    class Runner:
        def run(self):
            return "untouched"

    r = Runner()
    original = r.run
    for env in ({}, {faults.ENV_VAR: ""}, {faults.ENV_VAR: "  "}):
        assert install_from_env(r, env) is r
        assert r.run == original and not hasattr(r, "fault_injector")


class _ModelRunner:
    def forward(self, input_ids, meta):
        return torch.zeros(3, 8)  # [S, V]


def test_model_forward_raises_at_step_n():
    r = _ModelRunner()
    install(r, FaultConfig(forward_raise_at_step=3))
    r.forward(None, None)
    r.forward(None, None)
    with pytest.raises(InjectedFault):
        r.forward(None, None)
    r.forward(None, None)  # fires once


def test_nan_row_poisons_exactly_one_row_once():
    r = _ModelRunner()
    install(r, FaultConfig(nan_row_at_step=2, nan_row=7))  # row clamped to the batch of 3
    assert torch.isfinite(r.forward(None, None)).all()
    logits = r.forward(None, None)
    assert torch.isfinite(logits).all(dim=-1).tolist() == [True, True, False]
    assert torch.isfinite(r.forward(None, None)).all()


def test_null_runner_nan_marks_row_and_stall_sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)

    class Out:
        def __init__(self):
            self.is_finite = [True, True]

    class NullRunner:
        def run(self, *a):
            return Out()

    r = NullRunner()
    install_from_env(r, {faults.ENV_VAR: "stall_step_at=1:4,nan_row_at_step=1:1"})
    assert r.run().is_finite == [True, False]
    assert slept == [4.0]
    assert r.fault_injector.fired == ["stall", "nan"]


def test_arm_file_delays_counting(tmp_path):
    arm = tmp_path / "arm"
    r = _ModelRunner()
    inj = install(r, FaultConfig(forward_raise_at_step=1, arm_file=str(arm)))
    for _ in range(5):
        r.forward(None, None)  # unarmed: not counted
    assert inj.num_steps == 0
    arm.touch()
    with pytest.raises(InjectedFault):
        r.forward(None, None)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _dog(clock, state, stalls):
    return Watchdog(2.0, lambda: state["step"], lambda: state["busy"], stalls.append, poll_s=0.1, clock=clock)


def _wait(dog, clock, seconds: float) -> bool:
    """Advance the clock by `seconds`, polling every poll_s as the watchdog thread does; True if it tripped."""
    tripped = False
    for _ in range(round(seconds / dog.poll_s)):
        clock.t += dog.poll_s
        tripped |= dog.check()
    return tripped


def test_watchdog_trips_once_when_busy_without_progress():
    clock, state, stalls = _Clock(), {"step": 0, "busy": True}, []
    dog = _dog(clock, state, stalls)
    for _ in range(10):  # steady progress: never trips
        assert not _wait(dog, clock, 1.0)
        state["step"] += 1
    assert not _wait(dog, clock, 1.9)
    assert _wait(dog, clock, 0.3) and dog.tripped and stalls == [pytest.approx(2.05, abs=0.06)]
    assert not _wait(dog, clock, 10.0) and len(stalls) == 1  # latched


def test_watchdog_ignores_idle_time_before_work_appears():
    clock, state, stalls = _Clock(), {"step": 0, "busy": False}, []
    dog = _dog(clock, state, stalls)
    assert not _wait(dog, clock, 3600.0)  # idle for an hour
    state["busy"] = True
    assert not _wait(dog, clock, 1.0)  # work appeared 1 s ago: not a stall yet
    assert _wait(dog, clock, 1.5)


def test_watchdog_does_not_charge_a_frozen_process_to_the_engine():
    # SIGSTOP of the whole process for 40 s: the watchdog's own polls stop too. When both resume,
    # the engine gets a fresh timeout instead of being declared stalled for the frozen time.
    clock, state, stalls = _Clock(), {"step": 0, "busy": True}, []
    dog = _dog(clock, state, stalls)
    assert not _wait(dog, clock, 1.0)
    clock.t += 40.0  # no poll ran
    assert not dog.check()
    assert not _wait(dog, clock, 1.9)
    assert _wait(dog, clock, 0.3)  # still no progress after resuming: a real stall
    assert stalls == [pytest.approx(2.05, abs=0.06)]


def test_watchdog_treats_concurrent_mutation_as_progress():
    clock, stalls = _Clock(), []

    def racing():
        raise RuntimeError("deque mutated during iteration")

    dog = Watchdog(1.0, lambda: 0, racing, stalls.append, poll_s=0.1, clock=clock)
    assert not _wait(dog, clock, 10.0)
    assert stalls == []


def test_watchdog_thread_fires_callback():
    import threading

    fired = threading.Event()
    dog = Watchdog(0.2, lambda: 0, lambda: True, lambda s: fired.set(), poll_s=0.05)
    dog.start()
    try:
        assert fired.wait(5.0)
    finally:
        dog.stop()
