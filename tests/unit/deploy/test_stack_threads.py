"""Generation replicas on one machine split its torch threads instead of each taking them all."""

from services.stack.stack import Stack, StackConfig


def _threads(argv: list[str]) -> int | None:
    return int(argv[argv.index("--threads") + 1]) if "--threads" in argv else None


def test_replicas_share_the_default_thread_budget(tmp_path, monkeypatch):
    monkeypatch.setattr("services.stack.stack.default_threads", lambda: 14)  # a 16-core machine
    one = Stack(StackConfig.with_free_ports(log_dir=tmp_path))
    assert _threads(one.generation_argv(0)) is None  # a single replica picks its own default
    three = Stack(StackConfig.with_free_ports(log_dir=tmp_path, generation_replicas=3))
    assert [_threads(three.generation_argv(i)) for i in range(3)] == [4, 4, 4]
    many = Stack(StackConfig.with_free_ports(log_dir=tmp_path, generation_replicas=32))
    assert _threads(many.generation_argv(0)) == 1


def test_explicit_threads_and_the_null_engine_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr("services.stack.stack.default_threads", lambda: 14)
    told = Stack(StackConfig.with_free_ports(log_dir=tmp_path, generation_replicas=3, generation_args=["--threads", "5"]))
    assert told.generation_argv(1).count("--threads") == 1 and _threads(told.generation_argv(1)) == 5
    null = Stack(StackConfig.with_free_ports(log_dir=tmp_path, generation_replicas=3, null_engine=True))
    assert _threads(null.generation_argv(0)) is None
