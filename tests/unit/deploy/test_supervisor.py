"""The restart policy of services/stack/supervisor.py on a stand-in stack and a fake clock
(the real processes: tests/reliability/test_self_healing.py)."""

from __future__ import annotations

from types import SimpleNamespace

from services.stack.supervisor import RestartPolicy, Supervisor, describe_exit


class FakeChild:
    def __init__(self, pid: int) -> None:
        self.pid, self.log_path = pid, f"/logs/{pid}"
        self.proc = SimpleNamespace(returncode=None)

    def alive(self) -> bool:
        return self.proc.returncode is None

    def log_tail(self, lines: int = 30) -> str:
        return "last words"


class FakeStack:
    def __init__(self) -> None:
        self.children = {"generation": FakeChild(100), "envoy": FakeChild(200)}
        self.ready = {"generation": False, "envoy": True}
        self.restarts: list[str] = []

    def restart(self, name: str) -> FakeChild:
        self.restarts.append(name)
        child = self.children[name] = FakeChild(self.children[name].pid + 1)
        return child

    def ready_check(self, name: str):
        return lambda: self.ready[name]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(policy=RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, stable_s=60.0)):
    stack, clock, said = FakeStack(), Clock(), []
    return stack, clock, said, Supervisor(stack, policy, report=said.append, clock=clock)


def crash(stack: FakeStack, name: str, code: int = -9) -> None:
    stack.children[name].proc.returncode = code


def run_for(supervisor: Supervisor, clock: Clock, seconds: float, step: float = 0.05) -> None:
    for _ in range(round(seconds / step)):
        clock.t += step
        supervisor.poll()


def test_a_dead_child_is_restarted_after_the_backoff_and_announced_when_it_serves():
    stack, clock, said, sup = make()
    run_for(sup, clock, 10.0)
    assert stack.restarts == [] and said == []  # healthy children are left alone
    crash(stack, "generation")
    sup.poll()
    assert said[-1].startswith("generation was killed by SIGKILL after 10.0 s; restarting in 0.5 s (restart 1)")
    assert "last words" in said[-1]  # the tail of its log says why
    run_for(sup, clock, 0.4)
    assert stack.restarts == []  # not before the backoff
    run_for(sup, clock, 0.2)
    assert stack.restarts == ["generation"] and said[-1].startswith("generation restarted (pid 101")
    run_for(sup, clock, 1.0)
    assert not any("serving again" in m for m in said)  # loading: not ready yet
    stack.ready["generation"] = True
    run_for(sup, clock, 0.1)
    assert said[-1].startswith("generation is serving again")
    assert [e.what for e in sup.events] == ["exited", "restarted", "ready"]


def test_a_crash_loop_doubles_the_delay_up_to_the_cap_and_a_stable_run_resets_it():
    stack, clock, said, sup = make()
    delays = []
    for _ in range(5):  # dies right after every start
        crash(stack, "envoy", code=1)
        sup.poll()
        delays.append(float(said[-1].split("restarting in ")[1].split(" s")[0]))
        run_for(sup, clock, delays[-1] + 0.1)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert "exited with status 1" in said[0]
    run_for(sup, clock, 61.0)  # stayed up past stable_s
    crash(stack, "envoy")
    sup.poll()
    assert "restarting in 0.5 s (restart 6)" in said[-1]


def test_exit_descriptions():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3 (its engine failed)"
    assert describe_exit(0) == "exited with status 0"
