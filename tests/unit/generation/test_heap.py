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


def test_going_idle_also_releases_the_kv_blocks_that_cache_nothing(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    bm = engine.block_manager
    assert bm.bound_resident  # a CPU cache: pages become resident when written
    engine.heap_release = heap.IdleRelease(0.0, release=engine._release_idle_memory)
    release_blocks, released = engine.runner.release_blocks, []
    engine.runner.release_blocks = lambda ids: released.extend(ids) or release_blocks(ids)
    engine.add_request("a", list(range(3, 20)), SamplingParams(temperature=0.0, max_tokens=6))
    engine.add_request("b", list(range(30, 47)), SamplingParams(temperature=0.0, max_tokens=6))
    ever_used = []
    while engine.seqs or not released:
        engine.run_once()
        ever_used.append(bm.num_ever_used_blocks)
    assert len(released) == 2  # each request's partly filled last block (22 tokens in 4-token blocks)
    assert ever_used[-1] == max(ever_used) - 2
    assert all(bm.blocks[b].hash is not None for b in bm.free_block_ids)  # the prefix cache is untouched
    engine.add_request("c", list(range(3, 20)) + [5], SamplingParams(temperature=0.0, max_tokens=2))
    assert drive(engine)[1]["c"].num_cached_tokens == 16  # a's 4 full prompt blocks
