"""Freed heap pages go back to the OS when the engine goes idle after work (services/generation/heap.py)."""

import platform

import pytest
from generation_helpers import drive, make_engine

from services.generation import heap
from services.generation.sampling_params import SamplingParams


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_idle_release_needs_idle_new_steps_and_the_interval():
    clock, calls = Clock(), []
    idle = heap.IdleRelease(5.0, release=lambda: calls.append(clock.now) or True, clock=clock)
    clock.now += 6
    assert not idle.on_iteration(idle=False, steps=3)  # a request runs: never
    assert idle.on_iteration(idle=True, steps=3)
    assert not idle.on_iteration(idle=True, steps=3)  # no step since: nothing new was freed
    clock.now += 1
    assert not idle.on_iteration(idle=True, steps=9)  # too soon after the last one
    clock.now += 5
    assert idle.on_iteration(idle=True, steps=9)
    assert calls == [106.0, 112.0]


def test_the_engine_releases_once_its_requests_are_done(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    calls = []
    engine.heap_release = heap.IdleRelease(0.0, release=lambda: calls.append(len(engine.seqs)) or True)
    engine.add_request("a", list(range(3, 20)), SamplingParams(temperature=0.0, max_tokens=6))
    engine.add_request("b", list(range(3, 12)), SamplingParams(temperature=0.0, max_tokens=9))
    drive(engine)
    assert calls == [0]  # once, after the last request ended
    engine.run_once()
    assert calls == [0]


def test_glibc_malloc_trim_is_found_where_glibc_runs():
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert heap._MALLOC_TRIM is not None
    assert isinstance(heap.release(), bool)
