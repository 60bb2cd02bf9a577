"""bench/memory.py: a system's RSS is the sum over its whole process tree, each process once."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.memory import MB, RssSampler, tree_rss_bytes

# A parent that starts a child holding 64 MB, then both sleep until killed.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time; b = bytearray(64 << 20); print('CHILD', flush=True); time.sleep(60)"], stdout=sys.stdout)
time.sleep(60)
"""


@pytest.fixture
def tree():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "CHILD"  # the child holds its 64 MB now
        child = psutil.Process(parent.pid).children()[0]
        yield parent.pid, child.pid
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def test_a_tree_counts_the_parent_and_every_descendant(tree):
    parent, child = tree
    total = tree_rss_bytes([parent])
    assert _rss(child) > 64 * MB
    # Both processes sampled a moment apart: equal up to a little drift, never just the parent's.
    assert total == pytest.approx(_rss(parent) + _rss(child), rel=0.02)
    assert total > _rss(parent) + 64 * MB


def test_a_process_reached_twice_counts_once(tree):
    parent, child = tree
    assert tree_rss_bytes([parent, child]) == pytest.approx(tree_rss_bytes([parent]), rel=0.02)
    assert tree_rss_bytes([child, child]) == pytest.approx(_rss(child), rel=0.02)


def test_a_gone_process_counts_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert tree_rss_bytes([proc.pid]) == 0
    assert tree_rss_bytes([]) == 0


def test_the_sampler_keeps_the_peak_of_a_short_spike():
    # 96 MB held for ~0.5 s then freed: the peak stays, the end value does not show it.
    code = ("import time; time.sleep(0.3); b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); "
            "time.sleep(0.5); del b; time.sleep(0.6)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        with RssSampler([proc.pid], interval_s=0.05) as rss:
            base = tree_rss_bytes([proc.pid])
            proc.wait()
        assert rss.samples >= 10
        assert rss.peak_bytes > base + 64 * MB
        assert rss.peak_mb == round(rss.peak_bytes / MB, 1)
    finally:
        proc.kill()


def test_no_pids_measures_nothing():
    with RssSampler([0]) as rss:
        time.sleep(0.01)
    assert rss.samples == 0 and rss.peak_bytes == 0
