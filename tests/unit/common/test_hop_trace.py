"""services/common/hop_trace.py: off unless MSTAR_HOP_TRACE names a directory; records reach
this process's file in the format bench/hop_table.py parses."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.hop_table import read_dir
from services.common import hop_trace


def test_off_by_default():
    assert hop_trace.ENV not in os.environ
    assert hop_trace.ON is False


def test_records_are_flushed_to_the_process_file(tmp_path, monkeypatch):
    monkeypatch.setenv(hop_trace.ENV, str(tmp_path))
    hop_trace.mark("step", "", 3, 111)
    hop_trace.mark("pp_recv", "r0", 2, at_ns=42)
    hop_trace.flush()
    hop_trace.flush()  # nothing new: nothing appended
    recs = read_dir(tmp_path)
    assert [(r.hop, r.key, r.index, r.extra) for r in recs] == [("step", "", 3, "111"), ("pp_recv", "r0", 2, "")]
    assert recs[1].t_ns == 42
    assert (tmp_path / f"{os.getpid()}.tsv").exists()


def test_a_traced_process_flushes_at_exit(tmp_path):
    code = "from services.common import hop_trace; assert hop_trace.ON; hop_trace.mark('gen_write', 'r1', 0)"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, hop_trace.ENV: str(tmp_path)})
    assert [r.hop for r in read_dir(tmp_path)] == ["gen_write"]


def test_sigusr2_pauses_and_resumes_recording(tmp_path):
    code = ("import os, signal; from services.common import hop_trace\n"
            "hop_trace.mark('a', 'r', 0)\n"
            "os.kill(os.getpid(), signal.SIGUSR2); assert not hop_trace.ON\n"
            "os.kill(os.getpid(), signal.SIGUSR2); assert hop_trace.ON\n"
            "hop_trace.mark('b', 'r', 1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, hop_trace.ENV: str(tmp_path)})
    assert [r.hop for r in read_dir(tmp_path)] == ["a", "b"]


def test_an_unarmed_process_installs_no_handler():
    code = "import signal; from services.common import hop_trace; assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL"
    env = {k: v for k, v in os.environ.items() if k != hop_trace.ENV}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
